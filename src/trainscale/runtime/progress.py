"""Turn a collective that never completes into an error that names the missing ranks.

Each rank records "I am entering step S" in the process group's store (one small set per step).
When a collective times out, the rank that noticed reads everybody's record and names the ranks
that never arrived, and the operation it was waiting in, instead of the backend's bare "Timed out".

Two ways a timeout is noticed:

- gloo (CPU): the collective blocks the main thread and raises after the timeout, inside
  ``rt.guard(step)``, which turns it into :class:`CollectiveTimeout` (:meth:`ProgressTracker.explain`).
- NCCL (GPU): collectives are asynchronous. The main thread runs ahead and later blocks in a CUDA
  synchronisation that no Python exception can reach, while NCCL's own watchdog would end the
  process with a bare abort. So on NCCL the heartbeat thread also *watches*: when this rank has not
  entered a new step for the collective timeout and some rank is behind it, it names that rank,
  reports the error the way an uncaught one is reported (stderr, the launcher's error file) and
  ends the process (:meth:`ProgressTracker._watch`). ``trainscale.init`` gives NCCL's watchdog a
  longer timeout (``runtime.NCCL_BACKSTOP_S`` more) so that this diagnosis comes first.
"""

from __future__ import annotations

import datetime
import os
import sys
import threading
import time
from typing import Any, Callable

import torch.distributed as dist

from trainscale.errors import TrainscaleError

_KEY = "trainscale/progress/{rank}"
_TIMEOUT_MARKERS = ("Timed out", "timed out", "Timeout", "DistBackendError", "Watchdog caught collective operation timeout",
                    "timeout caused pair closure")  # gloo: a pair an earlier timeout closed (several buckets)
UNREACHABLE = "unreachable"
"""What :meth:`ProgressTracker.others` records for a rank whose record could not be read (store gone)."""


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
    collective still shows the last step it started. ``watch`` (default: on NCCL) makes the
    heartbeat also detect a stall itself; ``on_hang`` is what it does then (default: report and end
    the process, see :func:`end_process`).
    """

    HEARTBEAT_S = 0.5

    def __init__(self, runtime: Any, *, watch: bool | None = None,
                 on_hang: Callable[[CollectiveTimeout], None] | None = None) -> None:
        self.runtime = runtime
        self.store = _store() if runtime.is_distributed else None
        self.step = -1
        self.op = ""
        self.watch = bool(getattr(runtime, "uses_nccl", False)) if watch is None else watch
        self.on_hang = on_hang or (lambda error: end_process(runtime, error))
        self.fired: CollectiveTimeout | None = None
        self._marked_at = time.monotonic()
        self._next_look = 0.0
        self._published: tuple[int, str] | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def mark(self, step: int, op: str = "gradient all-reduce") -> None:
        self.step, self.op = step, op
        self._marked_at = time.monotonic()
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
                if self.watch and self.fired is None:
                    self._watch()
            except Exception:  # the store went away (teardown, rank 0 gone): stop quietly
                return

    def _watch(self) -> None:
        """Stalled for the collective timeout with some rank behind: that rank stopped participating."""
        now = time.monotonic()
        timeout_s = self.runtime.timeout.total_seconds()
        if now - self._marked_at < timeout_s or now < self._next_look:
            return
        # Everybody at the same step (a long checkpoint or evaluation on every rank) is no hang:
        # look again later rather than reading every rank's record at every heartbeat.
        self._next_look = now + min(30.0, max(self.HEARTBEAT_S, timeout_s / 4))
        seen = self._read_all()
        if not any(rec is None or rec == UNREACHABLE or rec[0] < self.step for rec in seen.values()):
            return
        self.fired = self._error(seen, waited_s=now - self._marked_at)
        self._stop.set()
        self.on_hang(self.fired)

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

    def others(self) -> dict[int, tuple[int, str] | str | None]:
        """rank -> (last step, op) as recorded; None when a rank never recorded anything,
        ``UNREACHABLE`` when its record could not be read (the store went with rank 0)."""
        if self.store is None:
            return {}
        self._stop.set()
        try:
            self._publish()
        except Exception:
            pass
        return self._read_all()

    def _read_all(self) -> dict[int, tuple[int, str] | str | None]:
        out: dict[int, tuple[int, str] | str | None] = {}
        if self.store is None:
            return out
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
                out[rank] = UNREACHABLE
        return out

    def explain(self, error: BaseException) -> CollectiveTimeout | None:
        """A CollectiveTimeout naming the missing ranks when ``error`` is a timeout; else None."""
        if isinstance(error, CollectiveTimeout):
            return error
        text = f"{type(error).__name__}: {error}"
        if not any(marker in text for marker in _TIMEOUT_MARKERS):
            return None
        return self._error(self.others())

    def _error(self, seen: dict[int, Any], waited_s: float | None = None) -> CollectiveTimeout:
        unreachable = sorted(r for r, rec in seen.items() if rec == UNREACHABLE)
        behind = sorted(r for r, rec in seen.items() if rec is None or (rec != UNREACHABLE and rec[0] < self.step))
        timeout_s = self.runtime.timeout.total_seconds()
        if behind:
            who = f"rank(s) {', '.join(map(str, behind))} did not arrive"
        elif unreachable and len(unreachable) == len(seen):
            who = "the other ranks' records are unreachable: rank 0, which holds them, may have died"
        else:
            who = "no rank is behind in the step count; a rank may be stuck inside the same step"

        def describe(rank: int, rec: Any) -> str:
            if rec == UNREACHABLE:
                return f"rank {rank}: unreachable"
            return f"rank {rank}: step {rec[0]}" if rec else f"rank {rank}: never started"

        detail = "; ".join(describe(r, rec) for r, rec in sorted(seen.items()))
        waited = f" (waited {waited_s:.0f}s)" if waited_s is not None else ""
        return CollectiveTimeout(
            f"rank {self.runtime.rank}: {self.op} at step {self.step} did not complete within {timeout_s:.0f}s{waited} — "
            f"{who} (last seen: {detail})",
            hint="look at the named rank's log for a hang or crash (deadlock, data loader stall, NFS); raise "
                 "--timeout if a step can legitimately take that long",
        )


def end_process(runtime: Any, error: CollectiveTimeout) -> None:
    """What the watching heartbeat does on a hang: the main thread is stuck where no exception can
    reach it, so report the error as an uncaught one would be, then end the process ourselves.

    In order: the runtime's timeout callbacks (``rt.on_collective_timeout``), the error on stderr,
    NCCL's flight-recorder trace (best effort, where this torch can dump it on demand), the
    launcher's error file (torchelastic's format, so `trainscale run` names it in its summary), exit 1.
    """
    for callback in list(getattr(runtime, "timeout_callbacks", ())):
        try:
            callback(error)
        except Exception as exc:  # a broken callback must not hide the diagnosis
            print(f"trainscale: timeout callback failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    print(f"trainscale: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
    _dump_flight_recorder(runtime.rank)
    try:
        raise error  # inside an except block, torch's ErrorHandler records the stack with the message
    except CollectiveTimeout as exc:
        try:
            from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

            ErrorHandler().record_exception(exc)
        except Exception as err:  # never hide the real error behind this one
            print(f"trainscale: could not write the error file: {err}", file=sys.stderr, flush=True)
    sys.stderr.flush()
    os._exit(1)


def _dump_flight_recorder(rank: int) -> None:
    """Write this rank's NCCL flight-recorder trace where NCCL's own dump on timeout would go.

    Ending the process before NCCL's watchdog means NCCL never dumps it; torch's CUDA builds can
    dump on demand through a private hook, so this is best effort and silent when it is missing.
    """
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    try:
        import torch

        dump = getattr(torch._C._distributed_c10d, "_dump_nccl_trace", None)
        if prefix is None or dump is None:
            return
        with open(f"{prefix}{rank}", "wb") as fh:
            fh.write(dump())
        print(f"trainscale: NCCL flight recorder trace written to {prefix}{rank}", file=sys.stderr, flush=True)
    except Exception:
        return
