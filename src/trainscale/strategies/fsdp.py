"""FSDP2: parameters, gradients and optimizer state sharded over the ranks (``fully_shard``).

Each parameter becomes a DTensor sharded on dim 0 over a 1-D device mesh of all ranks. Forward
all-gathers one unit (a sharded submodule) at a time; backward reduce-scatters its gradients, so each
rank keeps and updates only its shard. ``reshard_after_forward=False`` keeps the gathered parameters
between forward and backward: less communication, more memory (parameters are then only sharded at
rest, like ZeRO-2's gradient + optimizer sharding).

Checkpoints are sharded (``torch.distributed.checkpoint``): every rank writes its shards, and any
world size can resume (see trainscale/checkpoint/sharded.py).

With one process there is nothing to shard and no process group: the model runs unwrapped, and
checkpoints still go through DCP so they stay interchangeable with multi-rank ones. With a
``mixed_precision`` it is sharded over a group of one instead, so it computes in the same dtype as on
N ranks (a study's baseline and its multi-rank runs stay comparable).

``mixed_precision=fp16`` scales the loss (torch's ``ShardedGradScaler``, which agrees on overflow
across the ranks): fp16's range cannot hold small gradients, which would otherwise flush to zero.
The scaler's state is part of the checkpoint. A script that clips gradients itself must unscale
them first: ``strategy.scaler.unscale_(optimizer)``. bf16 has fp32's range and needs no scaling.

FSDP2 moved from ``torch.distributed._composable.fsdp`` (torch 2.4-2.5) to
``torch.distributed.fsdp`` (2.6); :func:`fsdp2` imports it from either.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed import fsdp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

from trainscale.checkpoint.state import DCP, ModelState
from trainscale.errors import ConfigError
from trainscale.observe.models import shard_units
from trainscale.runtime.device import MIXED_BACKEND
from trainscale.strategies.base import OptimizerSource, StrategyBase, one_rank_group
from trainscale.strategies.handout import through_strategy
from trainscale.strategies.optim import build_optimizer, parameter_names
from trainscale.strategies.portable import by_name, by_position, from_shards, optimizer_names

MIXED_PRECISION = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}
FSDP2_NAMES = ("fully_shard", "FSDPModule", "MixedPrecisionPolicy", "OffloadPolicy", "CPUOffloadPolicy")


def fsdp2() -> SimpleNamespace:
    """FSDP2's API from wherever this torch keeps it: ``torch.distributed.fsdp`` since 2.6, the
    ``_composable`` package before (the floor, torch 2.4, has it only there)."""
    public = fsdp
    if not all(hasattr(public, name) for name in FSDP2_NAMES):
        from torch.distributed._composable import fsdp as public  # noqa: PLC0415 (torch < 2.6 only)
    return SimpleNamespace(**{name: getattr(public, name) for name in FSDP2_NAMES})


@dataclass(kw_only=True)
class FSDPStrategy(StrategyBase):
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
    """Class names of submodules to shard as separate units (e.g. ("Block",)); default: the model's own
    ``_no_split_modules`` (its repeated blocks, the Hugging Face convention), else every direct child
    of the model that has parameters."""
    shard_alone: bool = False
    """Shard over a group of one when the run has one process (otherwise it runs unwrapped): FSDP's own
    per-unit work measured on one rank, as ``trainscale plan`` calibrates it."""

    name: str = "fsdp"
    storage = DCP
    scaler: Any = field(default=None, init=False, repr=False)
    """The loss scaler of an fp16 run (None otherwise), made by :meth:`wrap`."""

    def __post_init__(self) -> None:
        if self.mixed_precision not in MIXED_PRECISION:
            raise ConfigError(
                f"fsdp mixed_precision={self.mixed_precision!r} unknown",
                hint=f"use one of {', '.join(MIXED_PRECISION)}",
            )
        if isinstance(self.unit_modules, str):
            object.__setattr__(self, "unit_modules", tuple(n for n in self.unit_modules.split(",") if n))

    def wrap(self, model: nn.Module, optimizer: OptimizerSource, runtime: Any) -> tuple[nn.Module, Any]:
        names = parameter_names(model)  # the sharded parameters are new objects with the same names
        offload = self.cpu_offload and runtime.device.type == "cuda"
        if not offload:  # offloaded, fully_shard moves one unit at a time to the GPU and its shards back to host
            model = model.to(runtime.device)
        if not runtime.is_distributed and (self.mixed_precision != "none" or offload or self.shard_alone):
            # Alone, FSDP has nothing to shard, but its mixed precision and CPU offload live in the sharding:
            # shard over a group of one, so that a study's 1-rank baseline computes in the dtype its N-rank
            # runs do, and one GPU holds a model that fits only offloaded. Offload reduces host shards: gloo too.
            # shard_alone asks for it outright: one rank doing FSDP's own per-unit work (plan's calibration).

            one_rank_group(runtime, MIXED_BACKEND if offload else None)
        if dist.is_available() and dist.is_initialized():
            self._shard(model, runtime)
            if self.mixed_precision == "fp16":
                self.scaler = ShardedGradScaler(device=runtime.device.type)
        return model, build_optimizer(optimizer, model, names)

    def backward_loss(self, loss: torch.Tensor, model: nn.Module) -> None:
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def optimizer_step(self, optimizer: Any, model: nn.Module) -> None:
        if self.scaler is None:
            return optimizer.step()
        self.scaler.step(optimizer)  # skipped (and the scale lowered) when a gradient overflowed
        self.scaler.update()

    def user_optimizer(self, optimizer: Any, model: nn.Module) -> Any:
        if self.scaler is None:
            return optimizer

        return through_strategy(optimizer, self, model)  # opt.step() must go through the scaler

    def _shard(self, model: nn.Module, runtime: Any) -> None:
        # a one-process run's group is the strategy's own (one_rank_group), not the runtime's (None)
        check_offload_backend(self.cpu_offload, runtime.device.type, runtime.backend or str(dist.get_backend()))

        api = fsdp2()
        mesh = init_device_mesh(runtime.device.type, (runtime.world_size,))
        dtype = MIXED_PRECISION[self.mixed_precision]
        kwargs: dict[str, Any] = {
            "mesh": mesh,
            "reshard_after_forward": self.reshard_after_forward,
            "mp_policy": api.MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32 if dtype else None),
            # Pinned host memory needs a GPU; on a CPU-only run the offload is a no-op anyway.
            "offload_policy": (
                api.CPUOffloadPolicy(pin_memory=runtime.device.type == "cuda")
                if self.cpu_offload
                else api.OffloadPolicy()
            ),
        }
        for unit in self._units(model):
            api.fully_shard(unit, **kwargs)
        api.fully_shard(model, **kwargs)

    def _units(self, model: nn.Module) -> list[nn.Module]:
        if self.unit_modules:
            units = [m for m in model.modules() if type(m).__name__ in self.unit_modules and m is not model]
            if not units:
                found = sorted({type(m).__name__ for m in model.modules()})
                raise ConfigError(
                    f"fsdp unit_modules={list(self.unit_modules)} matched no submodule",
                    hint=f"module classes in this model: {', '.join(found)}",
                )
            return units
        return shard_units(model)

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
        # fully_shard changes the module's class in place; the only wrapper is torch.compile's (--compile)
        return getattr(model, "_orig_mod", model)

    def held_bytes(self, model: nn.Module, optimizer: Any) -> dict[str, int]:
        """At rest: a forward without backward (evaluation) can leave units gathered, with the full
        parameters registered on the module; reshard them first, then count the local shards."""
        fsdp_module = fsdp2().FSDPModule
        for module in model.modules():
            if isinstance(module, fsdp_module):
                module.reshard()
        return super().held_bytes(model, optimizer)

    # -- checkpoints: sharded DTensor state dicts, written by every rank ------------------------
    def checkpoint_state(self, model: nn.Module, optimizer: Any) -> ModelState:
        return ShardedState(self.unwrap(model), optimizer, self.scaler)

    def full_model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        return get_model_state_dict(self.unwrap(model), options=StateDictOptions(full_state_dict=True))


class ShardedState(ModelState):
    """Sharded DTensor state dicts (torch's get_state_dict), every rank writing its shards; the fp16 loss
    scaler's numbers (the same on every rank) ride along with the step and RNG."""

    storage = DCP

    def __init__(self, model: nn.Module, optimizer: Any, scaler: Any) -> None:
        self.model, self.optimizer, self.scaler = model, optimizer, scaler

    def state_dict(self) -> dict[str, Any]:
        model_state, optim_state = get_state_dict(self.model, self.optimizer, options=StateDictOptions())
        state = {"model": model_state, "optimizer": optim_state}
        if self.scaler is not None:
            state["grad_scaler"] = self.scaler.state_dict()
        return state

    def from_shards(self, shards: Any) -> dict[str, Any]:
        """Another strategy's own files (DeepSpeed's) as a rank-0 file's entries; DCP shards load directly."""
        return from_shards(self.model, self.optimizer, shards)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        model_state, optim_state, options = state_dict["model"], state_dict["optimizer"], StateDictOptions()
        if by_position(optim_state):  # a rank-0 file (ddp, zero1): the whole state, the optimizer's by position
            names = optimizer_names(self.model, self.optimizer)
            optim_state = by_name(optim_state, names, "the checkpoint")
            options = StateDictOptions(full_state_dict=True)  # every rank read the file: each keeps its shards
        set_state_dict(
            self.model, self.optimizer, model_state_dict=model_state, optim_state_dict=optim_state, options=options
        )
        if self.scaler is not None and state_dict.get("grad_scaler"):
            self.scaler.load_state_dict(state_dict["grad_scaler"])


def check_offload_backend(cpu_offload: bool, device_type: str, backend: str | None) -> None:
    """CPU offload on GPUs reduces host tensors too: an nccl-only group cannot (it fails later, mid-run)."""
    if cpu_offload and device_type == "cuda" and "gloo" not in (backend or ""):
        raise ConfigError(
            f"fsdp:cpu_offload=true on GPUs needs a process group with gloo for the host-side "
            f"shards, but this one is {backend!r}",
            hint='trainscale.init(backend="cpu:gloo,cuda:nccl") (the built-in workloads do this '
            "themselves: trainscale.strategies.process_group_backend(spec))",
        )
