"""What each strategy communicates per step, for ``trainscale plan`` (plan/model.py): its collectives in
all-reduces of the gradients' or parameters' bytes on a network's model, or each one priced as measured where
the ranks will run (:class:`Sweep`); and how torch's ZeRO-1 partitions the optimizer state in whole tensors.
Pure: the calibration's counts in, seconds or shares out. The network's model and its presets:
docs/scaling.md, "The plan's time model".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from trainscale.errors import ConfigError, did_you_mean

BUCKET_BYTES = 25 * 2**20
"""DDP's default ``bucket_cap_mb``."""


@dataclass(frozen=True, kw_only=True)
class Network:
    """The bus bandwidth and latency a ring all-reduce sees between nodes (``plan --interconnect``)."""

    name: str
    busbw_Bps: float
    """All-reduce bus bandwidth, bytes per second (nccl-tests' definition): line rate x links x efficiency."""
    latency_s: float = 0.0
    """Per ring step."""
    source: str = ""
    """Where the numbers come from."""

    def __post_init__(self) -> None:
        if not self.busbw_Bps > 0 or self.latency_s < 0:
            raise ConfigError(
                f"network {self.name!r}: bus bandwidth {self.busbw_Bps} B/s, latency {self.latency_s} s",
                hint="bus bandwidth must be > 0 and latency >= 0",
            )


NETWORKS: dict[str, Network] = {
    n.name: n
    for n in (
        Network(
            name="ethernet-25g",
            busbw_Bps=25e9 / 8 * 0.85,
            latency_s=30e-6,
            source="IEEE 802.3by 25GBASE line rate, 85% of it over TCP sockets",
        ),
        Network(
            name="ib-hdr200",
            busbw_Bps=200e9 / 8 * 0.92,
            latency_s=5e-6,
            source="InfiniBand HDR 200 Gb/s (ConnectX-6), one link, 92% of it",
        ),
        Network(
            name="ib-ndr400",
            busbw_Bps=400e9 / 8 * 0.90,
            latency_s=5e-6,
            source="InfiniBand NDR 400 Gb/s (ConnectX-7), one link, 90% of it",
        ),
        Network(
            name="slingshot-11",
            busbw_Bps=4 * 200e9 / 8 * 0.80,
            latency_s=10e-6,
            source="HPE Slingshot-11, 4 x 200 Gb/s NICs per LUMI-G node, 80% of them",
        ),
    )
}


def get_network(name: str) -> Network:
    if name not in NETWORKS:
        raise ConfigError(f"unknown interconnect {name!r}", hint=did_you_mean(name, list(NETWORKS)))
    return NETWORKS[name]


def bucket_count(gradient_bytes: float) -> int:
    """DDP's buckets (torch 2.13 measured: one bucket while the gradients fit in ``bucket_cap_mb``)."""
    return math.ceil(gradient_bytes / BUCKET_BYTES) if gradient_bytes > 0 else 0


def ring_allreduce_s(size_bytes: float, ranks: int, network: Network, buckets: int = 1) -> float:
    """A ring all-reduce of ``size_bytes`` among ``ranks`` split into ``buckets`` messages."""
    if ranks <= 1 or size_bytes <= 0:
        return 0.0
    steps = 2 * (ranks - 1)
    return steps / ranks * size_bytes / network.busbw_Bps + buckets * steps * network.latency_s


def collectives(strategy: str) -> tuple[float, float, float]:
    """What ``strategy`` communicates per step, in all-reduces of the gradients' or parameters' bytes (a
    reduce-scatter or an all-gather moves half an all-reduce's): (gradients' share that backward can hide,
    parameters' share backward can hide, parameters' share exposed). DDP all-reduces the gradients in
    buckets during backward; torch's ZeRO-1 too, then the updated parameters go from their owners to every
    rank after the step; DeepSpeed's stages 1 and 2 reduce-scatter the gradients and all-gather the updated
    parameters; FSDP and ZeRO-3 reduce-scatter the gradients, all-gather each block's parameters for backward
    (prefetched: hidden) and for forward (exposed)."""
    from trainscale.strategies import state_sharding  # noqa: PLC0415 (CLI start-up)

    shard = state_sharding(strategy)
    if shard.params:
        return 0.5, 0.5, 0.5
    if shard.buckets and not shard.optimizer:  # ddp
        return 1.0, 0.0, 0.0
    if shard.buckets:  # torch's ZeRO-1: DDP's all-reduce, then the parameters broadcast
        return 1.0, 0.0, 0.5
    return 0.5, 0.0, 0.5  # DeepSpeed stages 1-2


@dataclass(frozen=True, kw_only=True)
class Sweep:
    """The backend's all-reduce time by message size among ``ranks`` ranks, measured where they will run
    (bench/allreduce.py's sweep): what one collective of a sharded strategy costs there, its fixed cost
    included. On CPUs sharing cores that cost, not the bytes, is what FSDP's and ZeRO-1's many small
    collectives add to a step."""

    ranks: int
    points: tuple[tuple[float, float], ...]
    """(bytes, seconds), smallest first."""
    hook: str = "none"
    """What it timed (:attr:`HOOKS`)."""
    HOOKS: ClassVar[dict[str, str]] = {
        "none": "the backend's all-reduce",
        "shm": "DDP's shared-memory average, trainscale's ddp and zero1 on one node's CPUs (comm_hook=auto)",
    }

    def __post_init__(self) -> None:
        sizes = [b for b, _ in self.points]
        if (
            self.ranks < 2
            or self.hook not in self.HOOKS
            or not sizes
            or sizes != sorted(set(sizes))
            or min(sizes) <= 0
            or min(t for _, t in self.points) < 0
        ):
            raise ConfigError(
                f"an all-reduce sweep among {self.ranks} rank(s), hook {self.hook!r}, "
                f"{len(sizes)} timed size(s): nothing a step can be priced with",
                hint="measure it again: trainscale bench allreduce --nproc N shows the sweep",
            )

    @classmethod
    def from_result(cls, result: dict) -> Sweep:
        points = sorted(
            (float(r["bytes"]), float(r["time_s"]))
            for r in result.get("rows", [])
            if isinstance(r.get("time_s"), (int, float)) and r["time_s"] == r["time_s"] and r.get("iters")
        )  # NaN: not timed
        return cls(ranks=int(result["world_size"]), points=tuple(points), hook=str(result.get("hook") or "none"))

    def seconds(self, size: float) -> float:
        """Linear between the measured sizes; below the smallest its time (the fixed cost), above the largest
        the largest's time per byte."""
        points = self.points
        if size <= points[0][0]:
            return points[0][1]
        for (b0, t0), (b1, t1) in zip(points, points[1:]):
            if size <= b1:
                return t0 + (t1 - t0) * (size - b0) / (b1 - b0)
        return points[-1][1] * size / points[-1][0]


def sharded_comm_s(strategy: str, cal: Any, cost: Callable[[float], float]) -> float:
    """What ``strategy``'s own collectives add to a step beyond DDP's (``cal``: plan/model.Calibration's unit
    and tensor sizes), each charged ``cost`` of its bytes: an
    all-reduce's (measured: :meth:`Sweep.seconds`; on gloo an all-gather or reduce-scatter takes 0.6x-2x that,
    or the network's latency alone). FSDP and ZeRO-3 all-gather every
    unit for forward and for backward and reduce-scatter its gradients; torch's ZeRO-1 broadcasts every
    parameter from its owner after the step, all started at once (a broadcast is half an all-reduce, a ring's
    one pass: measured on gloo, 0.26 ms each against the all-reduce's 0.5 ms at 2 ranks); DeepSpeed's stages 1
    and 2 reduce-scatter the gradients and all-gather the parameters, bucketed. None can hide behind compute
    that needs the same cores."""
    from trainscale.strategies import state_sharding  # noqa: PLC0415 (CLI start-up)

    shard = state_sharding(strategy)
    if shard.params:
        return 3 * sum(cost(b) for b in (cal.units or (cal.params,)))
    if shard.whole_tensors:
        return sum(cost(b) for b in cal.tensor_bytes() or (cal.params,)) / 2
    if shard.optimizer:
        return cost(cal.grads) + cost(cal.params)
    return 0.0


def whole_tensor_share(groups: tuple[tuple[int, ...], ...], ranks: int) -> float:
    """The largest share of the parameters (by elements) one rank owns when ZeroRedundancyOptimizer partitions
    them: group by group, largest first, each to the rank holding the fewest elements so far over all groups
    (torch's ``_partition_parameters``)."""
    total = sum(sum(g) for g in groups)
    if not total:
        return 1.0 / ranks
    held = [0] * ranks  # one count over all the groups, as torch keeps it
    for group in groups:
        for numel in sorted(group, reverse=True):
            held[held.index(min(held))] += numel
    return max(held) / total
