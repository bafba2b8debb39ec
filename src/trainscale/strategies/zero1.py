"""ZeRO stage 1: DDP for the model, the optimizer state partitioned over the ranks.

Each rank keeps the full parameters and gradients (DDP all-reduces them as usual) but builds optimizer
state only for its own partition of the parameters; after its step it broadcasts the parameters it
updated. The arithmetic per parameter is the same as DDP's, so results match DDP bit for bit.

Checkpoints are rank-0 files, like DDP's: ``consolidate_state_dict(to=0)`` gathers every rank's
partition on rank 0 (on the CPU), and loading hands each rank the part it owns. We chose this over a
sharded (DCP) checkpoint because the file then has the plain ``optimizer.state_dict()`` layout: any
world size can resume from it (ZeRO-1 re-partitions on load), and nothing else has to understand a new
format. The cost is that rank 0 briefly holds the whole optimizer state in host memory while saving;
the consolidated copy is dropped right after.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer

from trainscale.strategies.base import OptimizerFactory, as_optimizer_spec
from trainscale.strategies.ddp import DDPStrategy


@dataclass(kw_only=True)
class Zero1Strategy(DDPStrategy):
    """DDP + ``ZeroRedundancyOptimizer``: per-rank optimizer state is about 1/N of DDP's."""

    parameters_as_bucket_view: bool = False
    """Pack each rank's parameters into one flat buffer for the broadcast (fewer, larger messages)."""

    name: str = "zero1"
    sharded_checkpoint: bool = False

    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory, runtime: Any) -> tuple[nn.Module, Any]:
        spec = as_optimizer_spec(make_optimizer)
        model, _ = super().setup(model, lambda params: None, runtime)
        if not runtime.is_distributed:  # one process: nothing to partition
            return model, spec(model.parameters())
        optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=spec.cls,
                                            parameters_as_bucket_view=self.parameters_as_bucket_view,
                                            **spec.kwargs)
        return model, optimizer

    def state_dict(self, model: nn.Module, optimizer: Any) -> dict[str, Any]:
        model_state = self.unwrap(model).state_dict()
        if not isinstance(optimizer, ZeroRedundancyOptimizer):
            return {"model": model_state, "optimizer": optimizer.state_dict()}
        optimizer.consolidate_state_dict(to=0)  # a collective: every rank takes part
        if optimizer.rank != 0:
            return {"model": model_state, "optimizer": None}  # only rank 0 writes the file
        full = optimizer.state_dict()
        optimizer._all_state_dicts = []  # ZeRO keeps the consolidated copy otherwise: free it now
        return {"model": model_state, "optimizer": full}

    def load_state_dict(self, model: nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
        self.unwrap(model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if isinstance(optimizer, ZeroRedundancyOptimizer):
            # The wrapper's own copy of the loaded state is not used by ZeRO (its local optimizer's is).
            optimizer.state.clear()

    def local_state(self, model: nn.Module, optimizer: Any) -> dict[str, list[torch.Tensor]]:
        held = super().local_state(model, optimizer)
        if isinstance(optimizer, ZeroRedundancyOptimizer):
            held["optimizer"] = _state_tensors(optimizer.optim.state)
        return held


def _state_tensors(state: Any) -> list[torch.Tensor]:
    return [v for per_param in state.values() for v in per_param.values() if torch.is_tensor(v)]
