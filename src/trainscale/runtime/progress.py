"""Turn a collective that never completes into an error that names the hung rank(s), with their stack.

Each rank's heartbeat (:class:`ProgressTracker`) records in the store its step and the collectives it
has issued per channel; the rank that notices a timeout (gloo: inside ``rt.guard``, :meth:`~ProgressTracker.explain`;
NCCL: the heartbeat itself watches, :meth:`~ProgressTracker._watch`) names the ranks :func:`behind` and
asks them for their stacks (runtime/peers.py). How and why, gloo and NCCL: docs/gpu.md, "Hangs".
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
import threading
import time
import weakref
from typing import Any, Callable, NamedTuple

import torch.distributed as dist

from trainscale.errors import PEER_CLOSED, TrainscaleError, record_error
from trainscale.runtime import peers

_KEY = "trainscale/progress/{rank}"
_TIMEOUT_MARKERS = ("Timed out", "timed out", "Timeout", "DistBackendError", "Watchdog caught collective operation timeout",
                    "timeout caused pair closure")  # gloo: a pair an earlier timeout closed (several buckets)
UNREACHABLE = "unreachable"
"""What :meth:`ProgressTracker.others` records for a rank whose record could not be read (store gone)."""
READ_TIMEOUT = datetime.timedelta(seconds=5)
"""The tracker's own store connection gives up after this: a store gone with rank 0 must not hold up
the diagnosis for the job's whole collective timeout."""
MAX_STACKS = 4
"""Stacks put in one error: the first hung ranks' (the rest are named)."""
HINT = ("look at the named rank's stack and log for a hang or crash (deadlock, data loader stall, NFS); raise "
        "--timeout if a step can legitimately take that long")


class CollectiveTimeout(TrainscaleError):
    """A collective did not complete within the timeout because some rank(s) stopped participating."""


class Seen(NamedTuple):
    """One rank's record: its step, what it was doing, collectives issued per channel."""

    step: int
    op: str
    issued: dict[str, int]


_CHANNELS: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()


def track(name: str, channel: Any, group: "dist.ProcessGroup") -> None:
    """Count ``channel.collectives`` (an int that every rank's copy raises alike per collective) in this
    rank's record while ``group``, the process group whose ranks share it, lives: for collectives that do
    not go through a process group (``comm_hook=shm``). A channel of a destroyed group is not counted
    (it may outlive its group until garbage collection, with counts from a run that is over)."""
    _CHANNEL_GROUPS[name] = weakref.ref(group)
    _CHANNELS[name] = channel


_CHANNEL_GROUPS: "dict[str, weakref.ref]" = {}


def collectives_issued() -> dict[str, int]:
    """Collectives this rank has issued so far: per process group (torch's sequence number, raised
    when a collective is issued, before it completes) and per tracked channel."""
    out: dict[str, int] = {}
    try:
        groups = list(dist.distributed_c10d._world.pg_names.items())
    except (AttributeError, RuntimeError):  # another thread is creating a group: next beat
        groups = []
    for group, name in groups:
        try:
            out[f"pg:{name}"] = int(group._get_sequence_number_for_group())
        except (AttributeError, RuntimeError, ValueError):
            continue
    alive = {id(group) for group, _ in groups}
    for name, channel in list(_CHANNELS.items()):
        ref = _CHANNEL_GROUPS.get(name)
        group = ref() if ref is not None else None
        if group is not None and id(group) in alive:
            out[name] = int(getattr(channel, "collectives", 0))
    return out


def _store():
    try:
        return dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError):
        return None


def _own_connection(store: Any) -> tuple[Any, bool]:
    """(store, own): a connection of the tracker's own with :data:`READ_TIMEOUT` where torch can clone
    one (torch >= 2.5); else the shared one, whose timeout :meth:`ProgressTracker._read_all` restores."""
    if store is None:
        return None, False
    try:
        own = store.clone()
        own.set_timeout(READ_TIMEOUT)
        return own, True
    except Exception:  # no clone in this torch, or this store cannot: the shared one, carefully
        return store, False


class ProgressTracker:
    """Per-step progress, published to the store by a background heartbeat (no I/O on the step path).

    The heartbeat keeps running while the main thread is stuck, so a rank that stopped still shows
    where it was, and answers requests for its stack. ``watch`` (default: on NCCL) makes the
    heartbeat also detect a stall itself; ``on_hang`` is what it does then (default: report and end
    the process, see :func:`end_process`).
    """

    HEARTBEAT_S = 0.5

    def __init__(self, runtime: Any, *, watch: bool | None = None,
                 on_hang: Callable[[CollectiveTimeout], None] | None = None) -> None:
        self.runtime = runtime
        self.store, self._own = _own_connection(_store() if runtime.is_distributed else None)
        self.step = -1
        self.op = ""
        self.watch = bool(getattr(runtime, "uses_nccl", False)) if watch is None else watch
        self.on_hang = on_hang or (lambda error: end_process(runtime, error))
        self.fired: CollectiveTimeout | None = None
        self.issued: Callable[[], dict[str, int]] = collectives_issued
        """What this rank has issued, read at every beat (a test stands in for process groups here)."""
        self._marked_at = time.monotonic()
        self._next_look = 0.0
        self._suspects: dict[int, Any] | None = None
        self._published: str | None = None
        self._answered = 0
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
        if self.store is None:
            return
        record = json.dumps({"step": self.step, "op": self.op, "issued": self.issued()})
        if record == self._published:
            return
        with self._lock:
            self.store.set(_KEY.format(rank=self.runtime.rank), record)
        self._published = record

    def _beat(self) -> None:
        while not self._stop.wait(self.HEARTBEAT_S):
            try:
                self._publish()
                with self._lock:
                    self._answered = peers.answer(self.store, self.runtime.rank, self._answered)
                if self.watch and self.fired is None:
                    self._watch()
            except Exception:  # the store went away (teardown, rank 0 gone): stop quietly
                return

    def _watch(self) -> None:
        """Stalled for the collective timeout with some rank behind: that rank stopped participating.

        The rank behind must be seen so on two looks a few heartbeats apart, with the same record: a
        peer that issued the collective a moment ago may not have published it yet."""
        now = time.monotonic()
        timeout_s = self.runtime.timeout.total_seconds()
        if now - self._marked_at < timeout_s or now < self._next_look:
            return
        seen = self._read_all()
        suspects = {r: seen[r] for r in behind(seen, self.step)}
        if self.runtime.rank in suspects:  # this rank is the one others wait for: it waits in no collective
            suspects = {}
        if not suspects or suspects != self._suspects:
            self._suspects = suspects or None
            # Everybody in step (a long checkpoint or evaluation on every rank) is no hang: look again
            # later rather than reading every rank's record at every heartbeat.
            self._next_look = now + (4 * self.HEARTBEAT_S if suspects
                                     else min(30.0, max(self.HEARTBEAT_S, timeout_s / 4)))
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

    def others(self) -> dict[int, Seen | str | None]:
        """rank -> its :class:`Seen` record; None when a rank never recorded anything,
        ``UNREACHABLE`` when its record could not be read (the store went with rank 0)."""
        if self.store is None:
            return {}
        self._stop.set()
        with contextlib.suppress(Exception):
            self._publish()
        return self._read_all()

    def _read_all(self) -> dict[int, Seen | str | None]:
        """Every rank's record, this rank's own as it is now: the store's copy of it may be a heartbeat old
        (a store ``set`` is not acknowledged), and a rank must never name itself as the one behind."""
        out = self._read_records()
        if out:
            out[self.runtime.rank] = Seen(self.step, self.op, self.issued())
        return out

    def _read_records(self) -> dict[int, Seen | str | None]:
        previous = None if self._own else self.store.timeout
        if previous is not None:  # the shared connection (torch without Store.clone): put it back below
            self.store.set_timeout(READ_TIMEOUT)
        try:
            keys = [_KEY.format(rank=rank) for rank in range(self.runtime.world_size)]
            try:  # every rank has published: all records in one request, not two per rank (1,024 ranks
                with self._lock:  # diagnosing at once made two million requests to rank 0's store)
                    raws = self.store.multi_get(keys) if self.store.check(keys) else None
            except Exception:  # the store may be gone with rank 0: each rank's own answer below
                raws = None
            if raws is not None:
                return {rank: _seen(raw) for rank, raw in enumerate(raws)}
            out: dict[int, Seen | str | None] = {}
            for rank in range(self.runtime.world_size):
                key = _KEY.format(rank=rank)
                try:
                    with self._lock:
                        present = self.store.check([key])
                    if not present:
                        out[rank] = None
                        continue
                    with self._lock:
                        out[rank] = _seen(self.store.get(key))
                except Exception:  # the store itself may be gone with rank 0
                    out[rank] = UNREACHABLE
        finally:
            if previous is not None:
                self.store.set_timeout(previous)
        return out

    def explain(self, error: BaseException) -> CollectiveTimeout | None:
        """A CollectiveTimeout naming the missing ranks when ``error`` is a timeout; else None."""
        if isinstance(error, CollectiveTimeout):
            return error
        text = f"{type(error).__name__}: {error}"
        if any(marker in text for marker in _TIMEOUT_MARKERS):
            return self._error(self.others())
        if any(marker in text for marker in PEER_CLOSED):  # a peer timed out (or died)
            return self._relay()
        return None

    def _relay(self) -> CollectiveTimeout | None:
        """A peer closed its connection: if it timed out, it posts its diagnosis, which this rank's error
        carries (runtime/peers.py); a peer that crashed posts none, and the error stays as it was."""
        self._stop.set()
        if self.store is None:
            return None
        try:
            with self._lock:
                found = peers.await_diagnosis(self.store, peers.WAIT_S + 2 * self.HEARTBEAT_S)
        except Exception:  # the store went with rank 0
            found = None
        if found is None:
            return None
        return CollectiveTimeout(
            f"rank {self.runtime.rank}: {self.op} at step {self.step} failed: a peer timed out and closed its "
            f"connections; its diagnosis: {found}", hint=HINT)

    def _post(self, text: str, *, complete: bool) -> None:
        if self.store is not None:
            # the store may have gone with rank 0: this rank's own error still tells
            with contextlib.suppress(Exception), self._lock:
                peers.post(self.store, text, complete=complete)

    def _stacks(self, ranks: list[int], seen: dict[int, Any]) -> dict[int, str | None]:
        """The stacks of the hung ranks that have a heartbeat to answer (they recorded a step)."""
        asked = [r for r in ranks if isinstance(seen.get(r), Seen) and r != self.runtime.rank][:MAX_STACKS]
        if not asked or self.store is None:
            return {}
        try:
            with self._lock:
                return peers.request(self.store, asked)
        except Exception:  # the store went with rank 0: the names still stand
            return {}

    def _error(self, seen: dict[int, Any], waited_s: float | None = None) -> CollectiveTimeout:
        hung = behind(seen, self.step)
        unreachable = sorted(r for r, rec in seen.items() if rec == UNREACHABLE)
        timeout_s = self.runtime.timeout.total_seconds()
        if hung:
            who = f"rank(s) {', '.join(map(str, hung))} did not arrive"
        elif unreachable and len(unreachable) == len(seen):
            who = "the other ranks' records are unreachable: rank 0, which holds them, may have died"
        else:
            who = ("no rank is behind in steps or in collectives issued; the ranks may be waiting in different "
                   "collectives, or one is stuck inside a collective")
        waited = f" (waited {waited_s:.0f}s)" if waited_s is not None else ""
        lines = [f"rank {self.runtime.rank}: {self.op} at step {self.step} did not complete within {timeout_s:.0f}s"
                 f"{waited} — {who} (last seen: {_describe(seen, hung)})"]
        self._post(lines[0], complete=False)
        for rank, text in self._stacks(hung, seen).items():
            lines.append(f"rank {rank}'s Python stack (main thread, innermost last):\n{text}" if text else
                         f"rank {rank} did not send its stack within {peers.WAIT_S:g}s (its Python may be "
                         "stuck holding the GIL)")
        self._post("\n".join(lines), complete=True)
        return CollectiveTimeout("\n".join(lines), hint=HINT)


def _seen(raw: bytes | str) -> Seen:
    record = json.loads(raw)
    return Seen(int(record["step"]), str(record["op"]), dict(record.get("issued", {})))


def behind(seen: dict[int, Any], step: int) -> list[int]:
    """The ranks holding the others up: no record, a step before ``step``, or — in ``step`` or later —
    the fewest collectives issued on a channel where another rank has issued more (that rank waits
    in a collective the laggard never joined; of several laggards the farthest back is the cause)."""
    out = {r for r, rec in seen.items() if rec is None or (isinstance(rec, Seen) and rec.step < step)}
    current = {r: rec for r, rec in seen.items() if isinstance(rec, Seen) and r not in out}
    channels = {name for rec in current.values() for name in rec.issued}
    for name in channels:
        counts = {r: rec.issued[name] for r, rec in current.items() if name in rec.issued}
        if len(counts) > 1 and min(counts.values()) < max(counts.values()):
            out |= {r for r, n in counts.items() if n == min(counts.values())}
    return sorted(out)


def _describe(seen: dict[int, Any], hung: list[int], limit: int = 16) -> str:
    """Every rank's record, the hung ones first; ranks alike beyond ``limit`` summed up."""
    most: dict[str, int] = {}
    for rec in seen.values():
        if isinstance(rec, Seen):
            for name, n in rec.issued.items():
                most[name] = max(most.get(name, n), n)

    def one(rank: int) -> str:
        rec = seen[rank]
        if rec == UNREACHABLE:
            return f"rank {rank}: unreachable"
        if rec is None:
            return f"rank {rank}: never started"
        lag = sum(most[name] - n for name, n in rec.issued.items() if n < most[name])
        return f"rank {rank}: step {rec.step}" + (f", {lag} collective(s) behind" if lag else "")

    order = hung + [r for r in sorted(seen) if r not in hung]
    shown = "; ".join(one(r) for r in order[:limit])
    return shown + (f"; {len(order) - limit} more rank(s)" if len(order) > limit else "")


def end_process(runtime: Any, error: CollectiveTimeout) -> None:
    """What the watching heartbeat does on a hang: the main thread is stuck where no exception can
    reach it, so report the error as an uncaught one would be, then end the process ourselves.

    In order: the runtime's timeout callbacks (``rt.on_collective_timeout``), the error on stderr,
    NCCL's flight-recorder trace (best effort, where this torch can dump it on demand), the
    launcher's error file (torchelastic's format, so `trainscale run` names it in its summary), exit 1.
    """
    call_timeout_callbacks(getattr(runtime, "timeout_callbacks", ()), error)
    print(f"trainscale: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
    _dump_flight_recorder(runtime.rank)
    try:
        raise error  # the stack it records is the one this raise gives it
    except CollectiveTimeout as exc:
        record_error(exc)
    sys.stderr.flush()
    os._exit(1)


def call_timeout_callbacks(callbacks: Any, error: CollectiveTimeout) -> None:
    for callback in list(callbacks):
        try:
            callback(error)
        except Exception as exc:  # a broken callback must not hide the diagnosis
            print(f"trainscale: timeout callback failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


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
