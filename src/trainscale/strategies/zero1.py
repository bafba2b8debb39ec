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

from trainscale.checkpoint.state import ModelState
from trainscale.strategies.base import OptimizerSource, state_tensors
from trainscale.strategies.ddp import DDPStrategy, ReplicaState
from trainscale.strategies.optim import as_recipe, build_optimizer, parameter_names


@dataclass(kw_only=True)
class Zero1Strategy(DDPStrategy):
    """DDP + ``ZeroRedundancyOptimizer``: per-rank optimizer state is about 1/N of DDP's."""

    parameters_as_bucket_view: bool = False
    """Pack each rank's parameters into one flat buffer for the broadcast (fewer, larger messages)."""

    name: str = "zero1"

    def wrap(self, model: nn.Module, optimizer: OptimizerSource, runtime: Any) -> tuple[nn.Module, Any]:
        names = parameter_names(model)
        model = self._replicate(model, runtime)
        if not runtime.is_distributed and not self.replicate_alone:  # one process: nothing to partition
            return model, build_optimizer(optimizer, model, names)
        recipe = as_recipe(optimizer, model, names)
        return model, ZeroRedundancyOptimizer(
            recipe.params(model),
            optimizer_class=recipe.cls,
            parameters_as_bucket_view=self.parameters_as_bucket_view,
            **recipe.defaults,
        )

    def advice(self, world_size: int, optimizer_share: float) -> str | None:
        return None  # the optimizer step is already split over the ranks

    def checkpoint_state(self, model: nn.Module, optimizer: Any) -> ModelState:
        partitioned = isinstance(optimizer, ZeroRedundancyOptimizer)
        return (PartitionedState if partitioned else ReplicaState)(self.unwrap(model), optimizer)

    def local_state(self, model: nn.Module, optimizer: Any) -> dict[str, list[torch.Tensor]]:
        held = super().local_state(model, optimizer)
        if isinstance(optimizer, ZeroRedundancyOptimizer):
            held["optimizer"] = state_tensors(optimizer.optim)  # this rank's partition only
        return held


class PartitionedState(ReplicaState):
    """The model replica and ZeRO's optimizer partitions, consolidated on rank 0 into one plain file."""

    def state_dict(self) -> dict[str, Any]:
        model_state = self.module.state_dict()
        self.optimizer.consolidate_state_dict(to=0)  # a collective: every rank takes part
        if self.optimizer.rank != 0:
            return {"model": model_state, "optimizer": None}  # only rank 0 writes the file
        full = self.optimizer.state_dict()
        self.optimizer._all_state_dicts = []  # ZeRO keeps the consolidated copy otherwise: free it now
        return {"model": model_state, "optimizer": full}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        # The wrapper's own copy of the loaded state is not used by ZeRO (its local optimizer's is).
        self.optimizer.state.clear()
