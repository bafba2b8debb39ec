"""The small protocol every parallel strategy implements (ddp, zero1, fsdp, deepspeed)."""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

import torch
from torch import nn

OptimizerFactory = Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer]


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


class PlainStepMixin:
    """backward/step/no_sync as a plain torch loop does them."""

    def backward(self, loss: torch.Tensor, model: nn.Module) -> None:
        loss.backward()

    def step(self, optimizer: Any, model: nn.Module) -> None:
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        return model.no_sync() if hasattr(model, "no_sync") else contextlib.nullcontext()

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model.module if hasattr(model, "module") else model
