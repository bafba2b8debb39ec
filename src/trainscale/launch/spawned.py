"""A process the script starts itself (``torch.multiprocessing.spawn``, as PyTorch's DDP tutorial does), observed
as a rank (launch/bootstrap.py wraps the function it starts; docs/launch.md "What every worker sees"). Imported by
name in the spawned process: not from the job kit, where the spawned processes run unobserved."""

from __future__ import annotations

import os
from typing import Any

from trainscale.observe.worker import observe_when_torch_loads, stop_observing


def spawned_rank(fn, nprocs: int, index: int, *args: Any) -> Any:
    """``fn(index, *args)`` as the ``index``-th of ``nprocs`` ranks: its records are its process group's rank's once
    it has one (its index and ``nprocs`` until then, and as its local rank and local world)."""
    os.environ.update(
        {"RANK": str(index), "LOCAL_RANK": str(index), "WORLD_SIZE": str(nprocs), "LOCAL_WORLD_SIZE": str(nprocs)}
    )
    observe_when_torch_loads()
    try:
        return fn(index, *args)
    finally:
        stop_observing()
