"""DistributedDataParallel: a full replica per rank, gradients averaged by all-reduce."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainscale.strategies.base import OptimizerFactory, PlainStepMixin


@dataclass(kw_only=True)
class DDPStrategy(PlainStepMixin):
    """The seeds' DDP, done once: device_ids on CUDA, none on CPU; one process passes the model through."""

    bucket_cap_mb: float = 25.0
    """Gradient bucket size for the all-reduce (DDP's default)."""
    find_unused_parameters: bool = False
    """Set when some parameters get no gradient in a step (costs an extra graph walk)."""
    gradient_as_bucket_view: bool = True
    """Gradients alias the communication buckets: saves one copy and memory."""
    static_graph: bool = False
    """The same parameters are used every step (enables DDP optimisations)."""

    name: str = "ddp"
    sharded_checkpoint: bool = False

    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory, runtime: Any) -> tuple[nn.Module, Any]:
        model = model.to(runtime.device)
        if runtime.is_distributed:
            model = DistributedDataParallel(
                model,
                device_ids=[runtime.device.index] if runtime.device.type == "cuda" else None,
                bucket_cap_mb=self.bucket_cap_mb,
                find_unused_parameters=self.find_unused_parameters,
                gradient_as_bucket_view=self.gradient_as_bucket_view,
                static_graph=self.static_graph,
            )
        return model, make_optimizer(model.parameters())

    def state_dict(self, model: nn.Module, optimizer: Any) -> dict[str, Any]:
        return {"model": self.unwrap(model).state_dict(), "optimizer": optimizer.state_dict()}

    def load_state_dict(self, model: nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
        self.unwrap(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])


def rebuild_buckets(model: nn.Module, forward_backward) -> None:
    """Let DDP lay out its gradient buckets now, as an uninterrupted run did after its first step.

    DDP orders its buckets by when gradients became ready in the first backward, and the
    all-reduce's summation order (so its fp32 rounding, with 3 or more ranks) follows that layout.
    A run resumed from a checkpoint calls this before its first real step — one forward and backward
    whose gradients, buffers and RNG draws are all discarded — so it continues bitwise like the run
    that was never interrupted.
    """
    if not isinstance(model, DistributedDataParallel):
        return
    import torch

    rng = torch.get_rng_state()
    buffers = [b.detach().clone() for b in model.buffers()]
    forward_backward()
    with torch.no_grad():
        for buffer, saved in zip(model.buffers(), buffers):
            buffer.copy_(saved)
    model.zero_grad(set_to_none=True)
    torch.set_rng_state(rng)
