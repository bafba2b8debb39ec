"""DistributedDataParallel: a full replica per rank, gradients averaged by all-reduce.

Overlap by default. DDP all-reduces a bucket of gradients as soon as every gradient in it is ready,
while backward goes on computing the earlier layers' gradients; only what is still in flight after the
last gradient is *exposed*. One bucket for the whole gradient overlaps nothing. The bucket rule
(``bucket_cap_mb=auto``, :func:`auto_bucket_cap_mb`): a quarter of the gradient, between 1 and 25 MiB
— so a model has about four buckets where its tensors allow (DDP never splits a tensor), each large
enough that an all-reduce's fixed latency stays small beside its transfer, and never above torch's own
25 MiB. Large models (100 MiB of gradients or more) get torch's own layout: a 1 MiB first bucket, then
25 MiB. A number in MiB is used as given (DDP then makes every bucket, the first included, that size).
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainscale.checkpoint.state import ModelState
from trainscale.errors import ConfigError, did_you_mean
from trainscale.strategies import comm_hooks
from trainscale.strategies.base import OptimizerSource, StrategyBase, one_rank_group
from trainscale.strategies.optim import build_optimizer, parameter_names
from trainscale.strategies.portable import from_shards
from trainscale.strategies.shm_allreduce import SharedMemoryUnavailable, applies, check_device

MiB = 1024 * 1024
TORCH_BUCKET_MB = 25.0  # DDP's default bucket cap (its first bucket is 1 MiB when the cap is left to it)
MIN_BUCKET_MB = 1.0
AUTO_BUCKETS = 4
OPTIMIZER_SHARE = 0.25  # above this share of the step, a replicated optimizer step is worth sharding


def auto_bucket_cap_mb(gradient_bytes: int) -> float:
    """``bucket_cap_mb=auto``: a quarter of the gradient, clamped to [1, 25] MiB (module docstring)."""
    return min(TORCH_BUCKET_MB, max(MIN_BUCKET_MB, gradient_bytes / AUTO_BUCKETS / MiB))


@dataclass(kw_only=True)
class DDPStrategy(StrategyBase):
    """The seeds' DDP, done once: device_ids on CUDA, none on CPU; one process passes the model through."""

    bucket_cap_mb: float | str = "auto"
    """Gradient bucket size in MiB, or auto: a quarter of the gradient between 1 and 25 MiB (overlap)."""
    find_unused_parameters: bool = False
    """Set when some parameters get no gradient in a step (costs an extra graph walk)."""
    gradient_as_bucket_view: bool = True
    """Gradients alias the communication buckets: saves one copy and memory."""
    static_graph: bool | str = "auto"
    """The same graph every step; auto: on in the training loop without gradient accumulation."""
    comm_hook: str = "auto"
    """Gradient communication: none (DDP's all-reduce), fp16, bf16 (compressed), powersgd (low rank), shm
    (CPU ranks on one node, through shared memory) or auto: shm where it applies, else none."""
    powersgd_rank: int = 1
    """PowerSGD's matrix approximation rank (higher: more accurate, more bytes)."""
    powersgd_start: int = 10
    """Optimizer steps all-reduced uncompressed before PowerSGD starts (at least 2)."""

    replicate_alone: bool = False
    """Wrap in DDP (zero1: and its ZeroRedundancyOptimizer) over a group of one when the run has one process
    (otherwise it runs unwrapped): DDP's buckets, hooks and all-reduces through a real group on one GPU."""

    name: str = "ddp"
    _accumulation: int | None = field(default=None, init=False, repr=False)
    """Micro-batches per step of the loop that will run this strategy (with_batch); None: unknown."""

    def __post_init__(self) -> None:
        cap = self.bucket_cap_mb
        if isinstance(cap, str):
            if cap.lower() != "auto":
                raise ConfigError(
                    f"strategy option bucket_cap_mb={cap!r} is neither a size in MiB nor auto",
                    hint="e.g. bucket_cap_mb=auto (the default) or bucket_cap_mb=4",
                )
            self.bucket_cap_mb = "auto"
        elif not (math.isfinite(cap) and cap > 0):
            raise ConfigError(
                f"strategy option bucket_cap_mb={cap} must be a positive size in MiB",
                hint="e.g. bucket_cap_mb=4, or bucket_cap_mb=auto",
            )
        if isinstance(self.static_graph, str):
            if self.static_graph.lower() != "auto":
                raise ConfigError(
                    f"strategy option static_graph={self.static_graph!r} is not auto, true or false",
                    hint="use static_graph=auto (the default), true or false",
                )
            self.static_graph = "auto"
        self.comm_hook = self.comm_hook.lower()
        if self.comm_hook not in comm_hooks.HOOKS:
            raise ConfigError(
                f"strategy option comm_hook={self.comm_hook!r} is not a communication hook",
                hint=did_you_mean(self.comm_hook, list(comm_hooks.HOOKS)),
            )
        if self.powersgd_rank < 1:
            raise ConfigError(
                f"strategy option powersgd_rank={self.powersgd_rank} must be >= 1",
                hint="e.g. powersgd_rank=1 (more compression) or 4 (more accurate)",
            )
        if self.powersgd_start < 2:
            # torch: with error feedback, PowerSGD can only start after DDP has rebuilt its buckets
            raise ConfigError(
                f"strategy option powersgd_start={self.powersgd_start} must be >= 2",
                hint="PowerSGD starts after DDP's first steps: e.g. powersgd_start=10",
            )

    def with_batch(self, micro_batch_size: int, accumulation: int | None = None) -> DDPStrategy:
        accumulation = accumulation or 1
        if self.static_graph is True and accumulation > 1:
            raise ConfigError(
                f"--strategy {self.name}:static_graph=true with --grad-accum {accumulation}: torch's "
                "DDP fails when gradients accumulate under no_sync with a static graph "
                "(pytorch/pytorch#143580)",
                hint="static_graph=auto (off while accumulating), or --grad-accum 1",
            )
        shaped = copy.copy(self)
        shaped._accumulation = accumulation
        return shaped

    def uses_static_graph(self) -> bool:
        """static_graph=auto is on only where trainscale runs the loop (the loop gave its shape with
        with_batch) and does not accumulate; off in scripts (rt.setup cannot see whether they
        accumulate with no_sync or change the graph between steps) and with find_unused_parameters."""
        if self.static_graph != "auto":
            return bool(self.static_graph)
        return self._accumulation == 1 and not self.find_unused_parameters

    def bucket_arguments(self, model: nn.Module, *, one_bucket: bool = False) -> dict[str, Any]:
        """DDP's bucket keyword for this model: bucket_cap_mb, or None where torch's own layout is the rule.
        ``one_bucket``: the whole gradient in one bucket (PowerSGD on gloo, see :meth:`_bucket_plan`)."""
        gradient_mb = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad) / MiB
        if one_bucket:
            return {"bucket_cap_mb": max(float(math.ceil(gradient_mb)), MIN_BUCKET_MB)}
        if self.bucket_cap_mb != "auto":
            return {"bucket_cap_mb": float(self.bucket_cap_mb)}
        cap = auto_bucket_cap_mb(int(gradient_mb * MiB))
        return {"bucket_cap_mb": None if cap >= TORCH_BUCKET_MB else cap}

    def _bucket_plan(self, model: nn.Module, runtime: Any) -> dict[str, Any]:
        """PowerSGD launches its second and third all-reduces of a bucket from the first one's completion
        callback. gloo runs those callbacks on its own threads, so with two buckets the ranks can launch
        their collectives in different orders: measured in torch 2.13, gloo aborts ("Received data size
        doesn't match expected size"). NCCL orders them on the stream. So on anything but NCCL PowerSGD
        gets one bucket (no overlap): chosen by auto, refused for an explicit smaller size."""
        ordered = runtime.device.type == "cuda" and "nccl" in str(dist.get_backend())
        if self.comm_hook != "powersgd" or ordered:
            return self.bucket_arguments(model)
        one = self.bucket_arguments(model, one_bucket=True)
        if self.bucket_cap_mb != "auto" and float(self.bucket_cap_mb) < one["bucket_cap_mb"]:
            raise ConfigError(
                f"comm_hook=powersgd with bucket_cap_mb={self.bucket_cap_mb} on {dist.get_backend()}: "
                "PowerSGD needs the whole gradient in one bucket there (its all-reduces start from "
                "gloo's callback threads, so two buckets' collectives can cross between the ranks)",
                hint=f"bucket_cap_mb={one['bucket_cap_mb']:g} or auto (one bucket), or comm_hook=fp16 "
                "or bf16, which keep the buckets overlapping",
            )
        if self.bucket_cap_mb == "auto":
            runtime.print(
                f"trainscale: ddp:comm_hook=powersgd on {dist.get_backend()}: one gradient bucket of "
                f"{one['bucket_cap_mb']:g} MiB (PowerSGD's collectives can cross between ranks with "
                "several); no overlap with backward"
            )
        return one

    def wrap(self, model: nn.Module, optimizer: OptimizerSource, runtime: Any) -> tuple[nn.Module, Any]:
        names = parameter_names(model)
        model = self._replicate(model, runtime)
        return model, build_optimizer(optimizer, model, names)

    def _replicate(self, model: nn.Module, runtime: Any) -> nn.Module:
        model = model.to(runtime.device)
        if not runtime.is_distributed:
            if not self.replicate_alone:
                return model
            one_rank_group(runtime)
        hook = self.comm_hook
        if hook == "auto":  # shm for 2+ gloo ranks on the CPU (falling back to none below where they share no memory)
            hook = "shm" if applies(runtime.device, dist.get_backend(), dist.get_world_size()) else "none"
        comm_hooks.check_backend(hook, runtime.device)
        if hook == "shm":
            check_device(runtime.device)
        ddp = DistributedDataParallel(
            model,
            device_ids=[runtime.device.index] if runtime.device.type == "cuda" else None,
            find_unused_parameters=self.find_unused_parameters,
            gradient_as_bucket_view=self.gradient_as_bucket_view,
            static_graph=self.uses_static_graph(),
            **self._bucket_plan(model, runtime),
        )
        if hook != "none":
            try:
                comm_hooks.attach(
                    ddp,
                    hook,
                    powersgd_rank=self.powersgd_rank,
                    powersgd_start=self.powersgd_start,
                    gradient_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
                )
            except SharedMemoryUnavailable:
                if self.comm_hook != "auto":
                    raise
                # auto: the ranks cannot share memory (several nodes): DDP's own all-reduce, as with none
        return ddp

    def no_sync(self, model: nn.Module) -> contextlib.AbstractContextManager:
        if getattr(getattr(model, "_orig_mod", model), "static_graph", False):
            # torch would fail deep inside backward (an internal assert): say what to change instead
            raise ConfigError(
                f"gradient accumulation (no_sync) with --strategy {self.name}:static_graph=true: "
                "torch's DDP fails when gradients accumulate under no_sync with a static graph "
                "(pytorch/pytorch#143580)",
                hint=f"--strategy {self.name}:static_graph=false (or auto)",
            )
        return super().no_sync(model)

    def advice(self, world_size: int, optimizer_share: float) -> str | None:
        """A suggestion for a run whose optimizer step took ``optimizer_share`` of the step: every DDP
        rank runs the whole optimizer step, ZeRO-1 splits it over the ranks."""
        if world_size < 2 or optimizer_share < OPTIMIZER_SHARE:
            return None
        return (
            f"the optimizer step takes {optimizer_share:.0%} of the step and every rank runs all of it: "
            f"try --strategy zero1 (each of the {world_size} ranks updates its own part of the parameters, "
            f"whole tensors at a time; docs/strategies.md)"
        )

    def checkpoint_state(self, model: nn.Module, optimizer: Any) -> ModelState:
        return ReplicaState(self.unwrap(model), optimizer)

    def after_resume(self, model: nn.Module, forward_backward: Callable[[], None]) -> None:
        rebuild_buckets(model, forward_backward)


class ReplicaState(ModelState):
    """A full replica's model and optimizer state, written by rank 0 into one file."""

    def __init__(self, module: nn.Module, optimizer: Any) -> None:
        self.module, self.optimizer = module, optimizer

    def state_dict(self) -> dict[str, Any]:
        return {"model": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.module.load_state_dict(state_dict["model"])
        self.optimizer.load_state_dict(state_dict["optimizer"])

    def from_shards(self, shards: Any) -> dict[str, Any]:
        return from_shards(self.module, self.optimizer, shards)


def rebuild_buckets(model: nn.Module, forward_backward, device: torch.device | None = None) -> None:
    """Let DDP lay out its gradient buckets now, as an uninterrupted run did after its first step.

    DDP orders its buckets by when gradients became ready in the first backward, and the
    all-reduce's summation order (so its fp32 rounding, with 3 or more ranks) follows that layout.
    A run resumed from a checkpoint calls this before its first real step — one forward and backward
    whose gradients, buffers and RNG draws are all discarded — so it continues bitwise like the run
    that was never interrupted. With ``static_graph`` DDP records the order in its *second* backward
    (the first only counts each gradient's hooks and all-reduces at its end), so two steps are
    discarded there. The draws are discarded on the model's GPU too (dropout on CUDA
    draws from the device's generator, not the CPU's): ``torch.random.fork_rng`` restores both.
    ``device``: where the model lives (default: its parameters' device).
    """
    model = getattr(model, "_orig_mod", model)  # torch.compile's wrapper
    if not isinstance(model, DistributedDataParallel):
        return
    device = device or next(model.parameters()).device
    buffers = [b.detach().clone() for b in model.buffers()]
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        forward_backward()
        if model.static_graph:  # its first backward only counts the hooks; the second records the order
            model.zero_grad(set_to_none=True)
            forward_backward()
    with torch.no_grad():
        for buffer, saved in zip(model.buffers(), buffers):
            buffer.copy_(saved)
    model.zero_grad(set_to_none=True)
