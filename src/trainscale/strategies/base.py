"""The small protocol every parallel strategy implements (ddp, zero1, fsdp, deepspeed)."""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Protocol, Union, runtime_checkable

import torch
from torch import nn

from trainscale.errors import ConfigError
from trainscale.runtime.memory import tensor_bytes


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer as a class and its keyword arguments, so a strategy can build it its own way
    (ZeRO-1 wraps the class, DeepSpeed may translate it into its config). Calling it builds it."""

    cls: type
    """A torch.optim.Optimizer subclass, e.g. torch.optim.AdamW."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Constructor arguments other than the parameters, e.g. {"lr": 1e-3}."""

    def __post_init__(self) -> None:
        if not (isinstance(self.cls, type) and issubclass(self.cls, torch.optim.Optimizer)):
            raise ConfigError(f"OptimizerSpec.cls is {self.cls!r}, not a torch.optim.Optimizer subclass",
                              hint="e.g. OptimizerSpec(torch.optim.AdamW, {'lr': 1e-3})")

    def __call__(self, params: Iterable[Any]) -> torch.optim.Optimizer:
        return self.cls(params, **self.kwargs)


# What strategy.setup accepts: an OptimizerSpec, or any callable params -> optimizer (the older form).
OptimizerFactory = Union[OptimizerSpec, Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]]


def as_optimizer_spec(make_optimizer: OptimizerFactory) -> OptimizerSpec:
    """The class and keyword arguments behind a factory. A plain callable is probed once on a
    throw-away parameter: its class and ``defaults`` (those the constructor accepts) are the spec."""
    if isinstance(make_optimizer, OptimizerSpec):
        return make_optimizer
    probe = make_optimizer([nn.Parameter(torch.zeros(1))])
    if len(probe.param_groups) != 1:
        raise ConfigError("the optimizer factory built several parameter groups from one parameter list",
                          hint="pass OptimizerSpec(cls, kwargs) to strategies that shard the optimizer")
    accepted = inspect.signature(type(probe)).parameters
    kwargs = {k: v for k, v in probe.defaults.items() if k in accepted}
    return OptimizerSpec(type(probe), kwargs)


@runtime_checkable
class Strategy(Protocol):
    name: str
    sharded_checkpoint: bool
    """True when every rank writes its own shard (torch.distributed.checkpoint), False for rank-0 files."""

    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory, runtime: Any) -> tuple[nn.Module, Any]:
        """Move/wrap the model for this strategy and build its optimizer; return (model, optimizer)."""

    def backward(self, loss: torch.Tensor, model: nn.Module) -> None: ...

    def step(self, optimizer: Any, model: nn.Module) -> None: ...

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Skip gradient synchronisation (gradient accumulation steps)."""

    def state_dict(self, model: nn.Module, optimizer: Any) -> dict[str, Any]:
        """Model and optimizer state in the form this strategy checkpoints."""

    def load_state_dict(self, model: nn.Module, optimizer: Any, state: dict[str, Any]) -> None: ...

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's module inside any wrapper."""

    def held_bytes(self, model: nn.Module, optimizer: Any) -> dict[str, int]:
        """Bytes of {"params", "grads", "optimizer"} stored on THIS rank (local shards only)."""


class PlainStepMixin:
    """backward/step/no_sync as a plain torch loop does them."""

    _grad_bytes: int = 0

    def backward(self, loss: torch.Tensor, model: nn.Module) -> None:
        loss.backward()

    def step(self, optimizer: Any, model: nn.Module) -> None:
        optimizer.step()
        if not self._grad_bytes:  # gradients are gone after zero_grad: count them once, here
            self._grad_bytes = tensor_bytes(p.grad for p in model.parameters())
        optimizer.zero_grad(set_to_none=True)

    def local_state(self, model: nn.Module, optimizer: Any) -> dict[str, list[torch.Tensor]]:
        """Parameter and optimizer-state tensors this rank holds (DTensors count their local shard)."""
        state = getattr(optimizer, "state", {})
        return {"params": list(model.parameters()),
                "optimizer": [v for per in state.values() for v in per.values() if torch.is_tensor(v)]}

    def held_bytes(self, model: nn.Module, optimizer: Any) -> dict[str, int]:
        held = self.local_state(model, optimizer)
        return {"params": tensor_bytes(held["params"]), "grads": self._grad_bytes,
                "optimizer": tensor_bytes(held["optimizer"])}

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        return model.no_sync() if hasattr(model, "no_sync") else contextlib.nullcontext()

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if hasattr(model, "module") else model
