"""Turn a collective that never completes into an error that names the missing ranks.

Each rank records "I am entering step S" in the process group's store (one small set per step).
When a collective times out, the rank that noticed reads everybody's record and names the ranks
that never arrived, and the operation it was waiting in, instead of gloo's bare "Timed out".
"""

from __future__ import annotations

import datetime
import threading
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
    """Per-step progress, published to the store by a background heartbeat (no I/O on the step path).

    The heartbeat keeps running while the main thread is stuck, so a rank that stopped before a
    collective still shows the last step it started.
    """

    HEARTBEAT_S = 0.5

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.store = _store() if runtime.is_distributed else None
        self.step = -1
        self.op = ""
        self._published: tuple[int, str] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def mark(self, step: int, op: str = "gradient all-reduce") -> None:
        self.step, self.op = step, op
        if self.store is not None and self._thread is None:
            self._publish()
            self._thread = threading.Thread(target=self._beat, name="trainscale-progress", daemon=True)
            self._thread.start()

    def _publish(self) -> None:
        current = (self.step, self.op)
        if current == self._published or self.store is None:
            return
        with self._lock:
            self.store.set(_KEY.format(rank=self.runtime.rank), f"{current[0]}|{current[1]}")
        self._published = current

    def _beat(self) -> None:
        while not self._stop.wait(self.HEARTBEAT_S):
            try:
                self._publish()
            except Exception:  # the store went away (teardown, rank 0 gone): stop quietly
                return

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the heartbeat and wait for it (bounded: a store that hangs cannot hold up the exit).

        The wait matters: a daemon thread still inside a store call when the interpreter shuts
        down is ended by ``pthread_exit`` inside C++ code, and the process dies with
        "terminate called without an active exception" (SIGABRT) after training succeeded.
        """
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)

    @property
    def beating(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def others(self) -> dict[int, tuple[int, str] | None]:
        """rank -> (last step, op) as recorded, None when a rank never recorded anything."""
        out: dict[int, tuple[int, str] | None] = {}
        if self.store is None:
            return out
        self._stop.set()
        try:
            self._publish()
        except Exception:
            pass
        self.store.set_timeout(datetime.timedelta(seconds=5))
        for rank in range(self.runtime.world_size):
            key = _KEY.format(rank=rank)
            try:
                with self._lock:
                    present = self.store.check([key])
                if not present:
                    out[rank] = None
                    continue
                with self._lock:
                    raw = self.store.get(key)
                step, _, op = raw.decode().partition("|")
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
