"""FSDP2: parameters, gradients and optimizer state sharded over the ranks (``fully_shard``).

Each parameter becomes a DTensor sharded on dim 0 over a 1-D device mesh of all ranks. Forward
all-gathers one unit (a sharded submodule) at a time; backward reduce-scatters its gradients, so each
rank keeps and updates only its shard. ``reshard_after_forward=False`` keeps the gathered parameters
between forward and backward: less communication, more memory (parameters are then only sharded at
rest, like ZeRO-2's gradient + optimizer sharding).

Checkpoints are sharded (``torch.distributed.checkpoint``): every rank writes its shards, and any
world size can resume (see trainscale/checkpoint/sharded.py).

With one process there is nothing to shard and no process group: the model runs unwrapped, and
checkpoints still go through DCP so they stay interchangeable with multi-rank ones.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from trainscale.errors import ConfigError
from trainscale.strategies.base import OptimizerFactory, PlainStepMixin

MIXED_PRECISION = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(kw_only=True)
class FSDPStrategy(PlainStepMixin):
    """FSDP2 ``fully_shard`` over all ranks, each submodule with parameters one unit, then the root."""

    reshard_after_forward: bool = True
    """True: full sharding (ZeRO-3-like). False: parameters stay gathered between forward and backward
    (only gradients and optimizer state sharded during the step, ZeRO-2-like)."""
    mixed_precision: str = "none"
    """none, bf16 or fp16: the dtype of forward/backward compute; gradients are reduced in fp32 and the
    sharded fp32 parameters stay the optimizer's master copy."""
    cpu_offload: bool = False
    """Keep sharded parameters, gradients and optimizer state in host memory (GPU runs; slower)."""
    unit_modules: tuple[str, ...] = ()
    """Class names of submodules to shard as separate units (e.g. ("Block",)); default: every direct
    child of the model that has parameters."""

    name: str = "fsdp"
    sharded_checkpoint: bool = True

    def __post_init__(self) -> None:
        if self.mixed_precision not in MIXED_PRECISION:
            raise ConfigError(f"fsdp mixed_precision={self.mixed_precision!r} unknown",
                              hint=f"use one of {', '.join(MIXED_PRECISION)}")
        if isinstance(self.unit_modules, str):
            object.__setattr__(self, "unit_modules", tuple(n for n in self.unit_modules.split(",") if n))

    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory, runtime: Any) -> tuple[nn.Module, Any]:
        model = model.to(runtime.device)
        if runtime.is_distributed:
            self._shard(model, runtime)
        return model, make_optimizer(model.parameters())

    def _shard(self, model: nn.Module, runtime: Any) -> None:
        check_offload_backend(self.cpu_offload, runtime.device.type, runtime.backend)
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

        mesh = init_device_mesh(runtime.device.type, (runtime.world_size,))
        dtype = MIXED_PRECISION[self.mixed_precision]
        kwargs: dict[str, Any] = {
            "mesh": mesh,
            "reshard_after_forward": self.reshard_after_forward,
            "mp_policy": MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None),
            # Pinned host memory needs a GPU; on a CPU-only run the offload is a no-op anyway.
            "offload_policy": (CPUOffloadPolicy(pin_memory=runtime.device.type == "cuda") if self.cpu_offload
                               else OffloadPolicy()),
        }
        for unit in self._units(model):
            fully_shard(unit, **kwargs)
        fully_shard(model, **kwargs)

    def _units(self, model: nn.Module) -> list[nn.Module]:
        if self.unit_modules:
            units = [m for m in model.modules() if type(m).__name__ in self.unit_modules and m is not model]
            if not units:
                found = sorted({type(m).__name__ for m in model.modules()})
                raise ConfigError(f"fsdp unit_modules={list(self.unit_modules)} matched no submodule",
                                  hint=f"module classes in this model: {', '.join(found)}")
            return units
        return [child for child in model.children() if any(True for _ in child.parameters())]

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module) -> Iterator[None]:
        """Accumulate unsharded gradients locally; the next synced backward reduce-scatters them."""
        if not hasattr(model, "set_requires_gradient_sync"):
            yield
            return
        model.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            model.set_requires_gradient_sync(True)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return model  # fully_shard changes the module's class in place; there is no wrapper

    def held_bytes(self, model: nn.Module, optimizer: Any) -> dict[str, int]:
        """At rest: a forward without backward (evaluation) can leave units gathered, with the full
        parameters registered on the module; reshard them first, then count the local shards."""
        from torch.distributed.fsdp import FSDPModule

        for module in model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
        return super().held_bytes(model, optimizer)

    # -- checkpoints: sharded DTensor state dicts, written by every rank ------------------------
    def state_dict(self, model: nn.Module, optimizer: Any) -> dict[str, Any]:
        model_state, optim_state = get_state_dict(model, optimizer, options=StateDictOptions())
        return {"model": model_state, "optimizer": optim_state}

    def load_state_dict(self, model: nn.Module, optimizer: Any, state: dict[str, Any]) -> None:
        if "sharded" in state:  # a Found from a sharded checkpoint: read into this run's own layout
            state = {**state, **state["sharded"].load(self.state_dict(model, optimizer))}
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"],
                       options=StateDictOptions())

    def full_state_dict(self, model: nn.Module, optimizer: Any) -> dict[str, Any]:
        """Unsharded model and optimizer state on the CPU of every rank (a collective; for export/tests)."""
        model_state, optim_state = get_state_dict(
            model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return {"model": model_state, "optimizer": optim_state}


def check_offload_backend(cpu_offload: bool, device_type: str, backend: str | None) -> None:
    """CPU offload on GPUs reduces host tensors too: an nccl-only group cannot (it fails later, mid-run)."""
    if cpu_offload and device_type == "cuda" and "gloo" not in (backend or ""):
        raise ConfigError(f"fsdp:cpu_offload=true on GPUs needs a process group with gloo for the host-side "
                          f"shards, but this one is {backend!r}",
                          hint='trainscale.init(backend="cpu:gloo,cuda:nccl") (the built-in workloads do this '
                               'themselves: trainscale.strategies.process_group_backend(spec))')
