"""Turn a collective that never completes into an error that names the missing ranks.

Each rank records "I am entering step S" in the process group's store (one small set per step).
When a collective times out, the rank that noticed reads everybody's record and names the ranks
that never arrived, and the operation it was waiting in, instead of gloo's bare "Timed out".
"""

from __future__ import annotations

import datetime
from typing import Any

import torch.distributed as dist

from trainscale.errors import TrainscaleError

_KEY = "trainscale/progress/{rank}"
_TIMEOUT_MARKERS = ("Timed out", "timed out", "Timeout", "DistBackendError", "Watchdog caught collective operation timeout")


class CollectiveTimeout(TrainscaleError):
    """A collective did not complete within the timeout because some rank(s) stopped participating."""


def _store():
    try:
        return dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError):
        return None


class ProgressTracker:
    """Per-step progress marks in the store; cheap (one set per step), off for a single process."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.store = _store() if runtime.is_distributed else None
        self.step = -1
        self.op = ""

    def mark(self, step: int, op: str = "gradient all-reduce") -> None:
        self.step, self.op = step, op
        if self.store is not None:
            self.store.set(_KEY.format(rank=self.runtime.rank), f"{step}|{op}")

    def others(self) -> dict[int, tuple[int, str] | None]:
        """rank -> (last step, op) as recorded, None when a rank never recorded anything."""
        out: dict[int, tuple[int, str] | None] = {}
        if self.store is None:
            return out
        self.store.set_timeout(datetime.timedelta(seconds=5))
        for rank in range(self.runtime.world_size):
            key = _KEY.format(rank=rank)
            try:
                if not self.store.check([key]):
                    out[rank] = None
                    continue
                step, _, op = self.store.get(key).decode().partition("|")
                out[rank] = (int(step), op)
            except Exception:  # the store itself may be gone with rank 0
                out[rank] = None
        return out

    def explain(self, error: BaseException) -> CollectiveTimeout | None:
        """A CollectiveTimeout naming the missing ranks when ``error`` is a timeout; else None."""
        text = f"{type(error).__name__}: {error}"
        if not any(marker in text for marker in _TIMEOUT_MARKERS):
            return None
        seen = self.others()
        behind = sorted(r for r, rec in seen.items() if rec is None or rec[0] < self.step)
        timeout_s = self.runtime.timeout.total_seconds()
        who = (f"rank(s) {', '.join(map(str, behind))} did not arrive" if behind
               else "no rank is behind in the step count; a rank may be stuck inside the same step")
        detail = "; ".join(f"rank {r}: step {rec[0]}" if rec else f"rank {r}: never started" for r, rec in
                           sorted(seen.items()))
        return CollectiveTimeout(
            f"rank {self.runtime.rank}: {self.op} at step {self.step} did not complete within {timeout_s:.0f}s — "
            f"{who} (last seen: {detail})",
            hint="look at the named rank's log for a hang or crash (deadlock, data loader stall, NFS); raise "
                 "--timeout if a step can legitimately take that long",
        )
