"""CPU threads per rank: the OMP_NUM_THREADS the seeds set by hand."""

from __future__ import annotations

import os

import torch


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def threads_per_rank(local_world_size: int, cores: int | None = None) -> int:
    cores = usable_cores() if cores is None else cores
    return max(1, cores // max(1, local_world_size))


def apply_thread_count(local_world_size: int) -> tuple[int, str | None]:
    """Set OMP_NUM_THREADS (and torch's pool) when the user has not; return (threads, reason or None)."""
    raw = os.environ.get("OMP_NUM_THREADS")
    if raw:
        try:
            torch.set_num_threads(max(1, int(raw)))
        except ValueError:
            pass
        return torch.get_num_threads(), None
    count = threads_per_rank(local_world_size)
    os.environ["OMP_NUM_THREADS"] = str(count)
    torch.set_num_threads(count)
    return count, f"OMP_NUM_THREADS={count} ({usable_cores()} usable cores / {local_world_size} local rank(s)); set it yourself to override"
