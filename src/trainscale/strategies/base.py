"""The small protocol every parallel strategy implements (ddp, zero1, fsdp, deepspeed), and what they share.

What a training loop needs from a strategy, and nothing that depends on which one it is: the methods
of :class:`Strategy`, each a plain torch loop's step in :class:`StrategyBase` unless a strategy differs.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol, Union, runtime_checkable

import torch
import torch.distributed as dist
from torch import nn

from trainscale.checkpoint.state import FILE, ModelState, Storage
from trainscale.errors import ConfigError
from trainscale.runtime.memory import tensor_bytes


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer as a class and its keyword arguments, so a strategy can build it its own way
    (ZeRO-1 wraps the class). Calling it builds it."""

    cls: type
    """A torch.optim.Optimizer subclass, e.g. torch.optim.AdamW."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Constructor arguments other than the parameters, e.g. {"lr": 1e-3}."""

    def __post_init__(self) -> None:
        if not (isinstance(self.cls, type) and issubclass(self.cls, torch.optim.Optimizer)):
            raise ConfigError(
                f"OptimizerSpec.cls is {self.cls!r}, not a torch.optim.Optimizer subclass",
                hint="e.g. OptimizerSpec(torch.optim.AdamW, {'lr': 1e-3})",
            )

    def __call__(self, params: Iterable[Any]) -> torch.optim.Optimizer:
        return self.cls(params, **self.kwargs)


# What wrap() accepts: an optimizer built on the model's parameters, an OptimizerSpec, or any callable
# params -> optimizer.
OptimizerSource = Union[  # noqa: UP007  (a runtime alias)
    torch.optim.Optimizer, OptimizerSpec, Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]
]


@runtime_checkable
class Strategy(Protocol):
    name: str
    storage: Storage
    """How its checkpoints are kept: FILE (rank 0), DCP (every rank's shards) or NATIVE (its own files)."""

    def with_batch(self, micro_batch_size: int, accumulation: int | None = None) -> Strategy:
        """The strategy for a loop of that shape (DeepSpeed's config needs both; the others return themselves)."""

    def wrap(self, model: nn.Module, optimizer: OptimizerSource, runtime: Any) -> tuple[nn.Module, Any]:
        """Move/wrap the model for this strategy and give its optimizer; return (model, optimizer)."""

    def backward_loss(self, loss: torch.Tensor, model: nn.Module) -> None: ...

    def accumulate(self, model: nn.Module, *, last: bool) -> contextlib.AbstractContextManager:
        """Around one micro-batch's forward and backward: gradients are synchronised on the last only."""

    def micro_step(self, optimizer: Any, model: nn.Module, *, last: bool) -> None:
        """After one micro-batch's backward: on the last, the optimizer steps and gradients are cleared."""

    def optimizer_step(self, optimizer: Any, model: nn.Module) -> None:
        """For scripts that step by hand (with :meth:`zero_grad`)."""

    def zero_grad(self, optimizer: Any, model: nn.Module) -> None: ...

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager: ...

    def checkpoint_state(self, model: nn.Module, optimizer: Any) -> ModelState:
        """A ModelState for the Checkpointer (checkpoint/state.py)."""

    def after_resume(self, model: nn.Module, forward_backward: Callable[[], None]) -> None:
        """What a resumed run does before its first step."""

    def unwrap(self, model: nn.Module) -> nn.Module:
        """The user's module inside any wrapper."""

    def num_parameters(self, model: nn.Module) -> int:
        """Parameters of the whole model, however this strategy shards or places them."""

    def full_model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        """Every parameter and buffer, whole, on every rank (a collective for sharded strategies)."""

    def held_bytes(self, model: nn.Module, optimizer: Any) -> dict[str, int]:
        """Bytes of {"params", "grads", "optimizer"} stored on THIS rank (local shards only)."""

    def torch_optimizer(self, optimizer: Any) -> torch.optim.Optimizer | None:
        """The torch optimizer whose param_groups carry the learning rate (for an LR scheduler)."""

    def user_optimizer(self, optimizer: Any, model: nn.Module) -> Any:
        """The optimizer handed to a script, whose step()/zero_grad() do this strategy's step."""

    def compile(self, model: nn.Module) -> nn.Module:
        """``torch.compile`` of the wrapped model, the way this strategy needs it (``--compile``)."""

    def check_compile(self) -> None:
        """Refuse ``--compile`` before launch where this strategy cannot compile its model."""

    def advice(self, world_size: int, optimizer_share: float) -> str | None:
        """What to try when the optimizer step took ``optimizer_share`` of a step on ``world_size`` ranks."""


def one_rank_group(runtime: Any, backend: str | None = None) -> None:
    """A process group of this one process where a strategy needs one even alone (DeepSpeed's engine;
    FSDP's mixed precision and CPU offload, which live in its sharding); trainscale's Runtime makes none
    for one process. ``backend``: the device's own by default. The Runtime then owns it: its close() is
    the one teardown path."""
    if dist.is_initialized():
        return
    backend = backend or ("nccl" if runtime.device.type == "cuda" else "gloo")
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    runtime.owns_process_group = True


def state_tensors(optimizer: Any) -> list[torch.Tensor]:
    """The tensors of an optimizer's per-parameter state (its moments, step counts...)."""
    return [v for per in getattr(optimizer, "state", {}).values() for v in per.values() if torch.is_tensor(v)]


class StrategyBase:
    """What a plain torch loop does, shared by the strategies; each overrides what it does differently."""

    storage: ClassVar[Storage] = FILE
    _grad_bytes: int = 0

    def with_batch(self, micro_batch_size: int, accumulation: int | None = None) -> Any:
        return self

    def backward_loss(self, loss: torch.Tensor, model: nn.Module) -> None:
        loss.backward()

    def accumulate(self, model: nn.Module, *, last: bool) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if last else self.no_sync(model)

    def micro_step(self, optimizer: Any, model: nn.Module, *, last: bool) -> None:
        if last:
            self.optimizer_step(optimizer, model)
            self.zero_grad(optimizer, model)

    def optimizer_step(self, optimizer: Any, model: nn.Module) -> None:
        optimizer.step()

    def zero_grad(self, optimizer: Any, model: nn.Module) -> None:
        if not self._grad_bytes:  # gradients are gone after zero_grad: count them once, here
            self._grad_bytes = tensor_bytes(p.grad for p in model.parameters())
        optimizer.zero_grad(set_to_none=True)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        return model.no_sync() if hasattr(model, "no_sync") else contextlib.nullcontext()

    def after_resume(self, model: nn.Module, forward_backward: Callable[[], None]) -> None:
        """Nothing to do by default (DDP lays out its gradient buckets here)."""

    def unwrap(self, model: nn.Module) -> nn.Module:
        model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper (--compile)
        return model.module if hasattr(model, "module") else model

    def num_parameters(self, model: nn.Module) -> int:
        return sum(p.numel() for p in self.unwrap(model).parameters())  # a DTensor counts its global size

    def full_model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return dict(self.unwrap(model).state_dict())

    def torch_optimizer(self, optimizer: Any) -> torch.optim.Optimizer | None:
        return optimizer if isinstance(optimizer, torch.optim.Optimizer) else None

    def user_optimizer(self, optimizer: Any, model: nn.Module) -> Any:
        return optimizer  # optimizer.step() and zero_grad() are all this strategy's step needs

    def compile(self, model: nn.Module) -> nn.Module:
        """The wrapped model compiled whole, as torch recommends for DDP: dynamo sees the DDP module and
        splits the graph at its buckets (``torch._dynamo.config.optimize_ddp``), so each bucket's
        all-reduce can still start during backward. Compiling the inner module before DDP wraps it
        would produce every gradient at the end of one compiled backward: no overlap."""
        return torch.compile(model)

    def check_compile(self) -> None:
        """Every strategy but DeepSpeed compiles its wrapped model."""

    def advice(self, world_size: int, optimizer_share: float) -> str | None:
        return None

    def local_state(self, model: nn.Module, optimizer: Any) -> dict[str, list[torch.Tensor]]:
        """Parameter and optimizer-state tensors this rank holds (DTensors count their local shard)."""
        return {"params": list(model.parameters()), "optimizer": state_tensors(optimizer)}

    def held_bytes(self, model: nn.Module, optimizer: Any) -> dict[str, int]:
        held = self.local_state(model, optimizer)
        grads = self._grad_bytes or tensor_bytes(p.grad for p in model.parameters())
        return {"params": tensor_bytes(held["params"]), "grads": grads, "optimizer": tensor_bytes(held["optimizer"])}
