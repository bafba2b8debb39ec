"""Per-rank memory report: peak memory, and the bytes of parameters, gradients and optimizer state
this rank holds, gathered to rank 0 and printed as one table at the end of a run.

The byte counts are what makes ZeRO/FSDP's saving visible: under DDP every rank holds everything;
under ZeRO-1 the optimizer state is split N ways; under FSDP (full shard) all three are. Strategies
say which tensors are theirs (``strategy.held_bytes``); this module counts, measures and prints.
"""

from __future__ import annotations

import resource
import sys
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist

KINDS = ("params", "grads", "optimizer")


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The part of ``t`` stored on this rank: a DTensor's local shard, else the tensor itself."""
    to_local = getattr(t, "to_local", None)
    return to_local() if callable(to_local) else t


def tensor_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes held by these tensors on this rank, each storage counted once (views and aliases such as
    DDP's gradient buckets share one)."""
    seen: set[tuple[str, int]] = set()
    total = 0
    for t in tensors:
        if t is None:
            continue
        t = local_tensor(t)
        if t.device.type == "meta":
            continue
        storage = t.untyped_storage()
        key = (str(t.device), storage.data_ptr())
        if storage.data_ptr() == 0 or key in seen:
            # An empty storage (e.g. a freed DeepSpeed stage-3 parameter) holds nothing.
            continue
        seen.add(key)
        total += storage.nbytes()
    return total


def peak_memory(device: torch.device) -> tuple[int, str]:
    """(bytes, what was measured): CUDA's max_memory_allocated on a GPU, else the process's peak RSS."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda max_memory_allocated"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # ru_maxrss is in KiB on Linux and in bytes on macOS.
    return int(rss if sys.platform == "darwin" else rss * 1024), "process peak RSS"


@dataclass(frozen=True)
class RankMemory:
    """What one rank holds at the end of a run."""

    rank: int
    """Global rank."""
    peak_bytes: int
    """Peak memory of this rank (see ``peak_source``)."""
    peak_source: str
    """cuda max_memory_allocated, or process peak RSS on CPU (includes the Python interpreter and libraries)."""
    params: int
    """Bytes of parameters stored on this rank (local shards only)."""
    grads: int
    """Bytes of gradients stored on this rank (as of the last optimizer step)."""
    optimizer: int
    """Bytes of optimizer state stored on this rank (local partition only)."""

    @property
    def state(self) -> int:
        return self.params + self.grads + self.optimizer


def gather(runtime: Any, mine: RankMemory) -> list[RankMemory]:
    """Every rank's RankMemory, in rank order, on every rank (a collective: all ranks call it)."""
    if not runtime.is_distributed:
        return [mine]
    rows: list[Any] = [None] * runtime.world_size
    dist.all_gather_object(rows, asdict(mine))
    return [RankMemory(**r) for r in rows]


def mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def format_table(rows: list[RankMemory], strategy: str = "") -> str:
    """A fixed-width table, one line per rank and a total line."""
    head = f"memory per rank{f' ({strategy})' if strategy else ''}, MiB; peak = {rows[0].peak_source}"
    cols = ("rank", "peak", "params", "grads", "optimizer", "state")
    lines = [head, "".join(f"{c:>11}" for c in cols)]
    for r in rows:
        lines.append(
            f"{r.rank:>11}" + "".join(f"{mib(v):>11}" for v in (r.peak_bytes, r.params, r.grads, r.optimizer, r.state))
        )
    lines.append(
        f"{'total':>11}{'':>11}"
        + "".join(f"{mib(sum(getattr(r, k) for r in rows)):>11}" for k in KINDS)
        + f"{mib(sum(r.state for r in rows)):>11}"
    )
    return "\n".join(lines)


def report(runtime: Any, held: dict[str, int], strategy: str = "", print_table: bool = True) -> dict:
    """Measure this rank, gather all ranks, print the table on rank 0; returns a JSON-ready dict
    ``{"unit": "bytes", "peak_source": ..., "ranks": [{rank, peak_bytes, params, grads, optimizer, state}]}``."""
    peak, source = peak_memory(runtime.device)
    rows = gather(
        runtime,
        RankMemory(rank=runtime.rank, peak_bytes=peak, peak_source=source, **{k: int(held.get(k, 0)) for k in KINDS}),
    )
    if print_table and runtime.is_main:
        print(format_table(rows, strategy), flush=True)
    return {
        "unit": "bytes",
        "peak_source": rows[0].peak_source,
        "ranks": [{**{k: v for k, v in asdict(r).items() if k != "peak_source"}, "state": r.state} for r in rows],
    }
