"""CPU threads per rank: the OMP_NUM_THREADS the seeds set by hand."""

from __future__ import annotations

import contextlib
import os

import torch
import torch.distributed as dist

from trainscale.topology.apply import current_affinity


def usable_cores() -> int:
    return len(current_affinity())


def threads_per_rank(local_world_size: int, cores: int | None = None) -> int:
    cores = usable_cores() if cores is None else cores
    return max(1, cores // max(1, local_world_size))


def apply_thread_count(local_world_size: int) -> tuple[int, str | None]:
    """Set OMP_NUM_THREADS (and torch's pool) when the user has not; return (threads, reason or None)."""
    raw = os.environ.get("OMP_NUM_THREADS")
    if raw:
        with contextlib.suppress(ValueError):
            torch.set_num_threads(max(1, int(raw)))
        return torch.get_num_threads(), None
    count = threads_per_rank(local_world_size)
    os.environ["OMP_NUM_THREADS"] = str(count)
    torch.set_num_threads(count)
    return (
        count,
        f"OMP_NUM_THREADS={count} ({usable_cores()} usable cores / {local_world_size} local rank(s)); "
        "set it yourself to override",
    )


def node_cpus(runtime) -> int:
    """CPUs the ranks of rank 0's node can run on, together: the union of their affinities (one
    all-gather: every rank calls it). Ranks bound to their own cores add up; unbound ranks share the
    node's. What a job's nodes really give it, which a profile's ``cpus_per_node`` may overstate."""
    mine = sorted(current_affinity())
    if not runtime.is_distributed:
        return len(mine)

    rows: list = [None] * runtime.world_size
    dist.all_gather_object(rows, (runtime.node_rank, mine))
    node = rows[0][0]
    return len(set().union(*(set(cpus) for rank_node, cpus in rows if rank_node == node)))
