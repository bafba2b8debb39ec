"""The hang watch: what rank 0's heartbeat (rank 1's, when rank 0 stops responding) does with every rank's
record — once its own progress has stalled, it reads them all, keeps track of which ranks still beat, and
gives ONE notice when ranks have waited in a collective for the notice interval (runtime/hangwatch/verdict.py says
who is
missing, desynchronised or silent, and how); at the collective timeout the rank whose collective failed is
explained with the same verdict (:meth:`Watch.explain`), and on NCCL, where no exception reaches a waiting
main thread, the heartbeat ends the process with it (:func:`end_process`) — as it does on any backend at the hang
timeout (`--hang-timeout`: that long with no progress). One :class:`Watch` per heartbeat
(runtime/hangwatch/heartbeat.py), given it: it reads the heartbeat's store, rank and own record.
docs/reliability.md, "Hangs".
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import torch

from trainscale.env import node_name
from trainscale.errors import HUNG_EXIT, PEER_CLOSED, TrainscaleError, record_error
from trainscale.runtime.hangwatch import ledger, peers
from trainscale.runtime.hangwatch import verdict as hangs

KEY = "trainscale/progress/{rank}"
"""Where each rank's heartbeat record is, in the job's store."""
LOOK_AFTER_S, LOOK_EVERY_S = 2.0, 1.0
"""The watcher reads every record once its own progress stalled this long, then this often."""
_TIMEOUT_MARKERS = (
    "Timed out",
    "timed out",
    "Timeout",
    "DistBackendError",
    "Watchdog caught collective operation timeout",
    "timeout caused pair closure",
)  # gloo: a pair an earlier timeout closed (several buckets)
UNREACHABLE = hangs.UNREACHABLE
READ_TIMEOUT = datetime.timedelta(seconds=5)
"""The heartbeat's own store connection gives up after this: a store gone with rank 0 must not hold up
the diagnosis for the job's whole collective timeout."""
HINT = hangs.HINT
STACKS_WAIT_S = 5.0
"""How long a rank whose collective failed waits for the culprits' records to carry their stacks: a few beats,
loaded machines included. A rank whose Python holds the GIL cannot send them (its C watchdog writes them)."""


class CollectiveTimeout(TrainscaleError):
    """A collective did not complete within the timeout because some rank(s) stopped participating."""


class Watch:
    """The hang watch of one rank's heartbeat (runtime/hangwatch/heartbeat.py), given it: reads its record, store
    and step;
    keeps what it has seen of the other ranks."""

    def __init__(self, beat: Any) -> None:
        self.beat = beat
        self.fired: CollectiveTimeout | None = None
        self.noticed: hangs.Verdict | None = None
        self._next_look = 0.0
        self._seen: dict[int, tuple[int, float]] = {}  # rank -> (its beat, when it last changed)
        self._compared: list | None = None  # the step boundary whose counts it last compared

    # -- watching -------------------------------------------------------------------------------------
    def look(self, now: float) -> None:
        since = now - self.beat._changed_at
        if self.beat.rank == 0 and self.beat.notice_s > 0 and self.fired is None:
            self._desync(now, since)
        if since < LOOK_AFTER_S:
            self.noticed = None  # progress again: a later hang gets a notice of its own
            return
        if now < self._next_look or self.fired is not None:
            return
        self._next_look = now + LOOK_EVERY_S
        timeout_s = self.beat.runtime.timeout.total_seconds()
        since = max(since, self._in_flight_s(now))  # NCCL's clock: a host that ran ahead queued it earlier
        limit, anytime = self.beat.hang_timeout
        hung = 0 < limit <= since and (anytime or self.beat.step >= 0)  # --hang-timeout: gloo's too, before its own
        ends = (self.beat.watch and since >= timeout_s) or hung
        notices = self.beat.notice_s > 0 and self.noticed is None and self.beat.rank in (0, 1)
        if not (ends or notices):
            return
        if not ends and self.beat.rank == 1 and self._rank_zero_alive():
            return  # rank 1 only stands in for a rank 0 that stopped responding
        if notices:
            verdict = hangs.diagnose(self._states(now), notice_s=self.beat.notice_s)
            if verdict is not None:
                self.noticed = verdict
                self._notice(verdict)
        if ends and not (self.beat.watch and since >= timeout_s) and not self._in_collective(now):
            return  # past --hang-timeout outside any collective: this rank may be the hung one; the waiting ones end
        if ends:
            verdict = self.diagnose_now()
            # past the hang timeout a stuck collective (nobody to blame) ends too; NCCL's watchdog is its backstop
            if verdict is not None and (verdict.culprits or hung) and self.beat.rank not in verdict.culprits:
                self.fired = self._error(verdict, waited_s=since, limit_s=limit if hung else None)
                self.beat._stop.set()
                self.beat.on_hang(self.fired)

    def _desync(self, now: float, since: float) -> None:
        """The watcher's live comparison: the ranks' collective counts at each new step boundary (every beat a
        step ended), and, once stalled, the op and sizes of the collective each rank is in — a desync is proven
        there and then, so the job ends with it at once instead of waiting out a notice interval while gloo or
        NCCL mix the gradients or wait for a partner that never comes."""
        stalled = since >= LOOK_AFTER_S and now >= self._next_look
        last = self.beat.counts[-1] if self.beat.counts else None  # read once: the training thread appends
        if not stalled and (last is None or last == self._compared):
            return
        states = self._states(now)
        verdict = hangs.count_desync(states) or (hangs.ledger_desync(states) if stalled else None)
        if verdict is None:
            # compared once every rank's record has ended that step: one that had not yet published it is read again
            # at the next beat (else a rank that stalls right after its boundary is compared only once stalled)
            if last is not None and all(
                isinstance(s, hangs.State) and any(int(k) == last[0] for k, _ in s.counts or ())
                for s in states.values()
            ):
                self._compared = last
            return
        print(f"trainscale: {verdict.text()}", file=sys.stderr, flush=True)
        for listener in list(self.beat.listeners):
            with contextlib.suppress(Exception):
                listener(verdict)
        self.fired = self._error(verdict, waited_s=None, desync=True)
        self.beat._stop.set()
        self.beat.on_hang(self.fired)

    def _in_collective(self, now: float) -> bool:
        """Whether this rank waits in a collective: one in flight in its stall record, or its main thread in one."""
        return (
            any(not e.get("done") for e in self.beat._record(now).get("ledger") or ())
            or ledger.waiting_in(ledger.main_frame()) is not None
        )

    def _in_flight_s(self, now: float) -> float:
        """How long this rank's oldest collective still in flight has been queued (its flight record's age),
        0 without one: NCCL's watchdog times a collective from when it was queued, and a host that runs ahead
        of its GPU queues it before it enters the step its own stall is timed from."""
        if not self.beat._detail:
            return 0.0
        at, detail = self.beat._detail
        ages = [e.get("age_s") or 0.0 for e in detail.get("ledger") or () if not e.get("done")]
        return max(ages) + (now - at) if ages else 0.0

    def _rank_zero_alive(self) -> bool:
        try:
            with self.beat._lock:
                raw = self.beat.store.get(KEY.format(rank=0))
        except Exception:
            return False  # the store went with rank 0 (srun mode: rank 0 hosts it)
        beat = json.loads(raw).get("beat", 0)
        seen = self._seen.get(0)
        now = time.monotonic()
        if seen is None or seen[0] != beat:
            self._seen[0] = (beat, now)
            return True
        return now - seen[1] < hangs.STALE_S

    def _notice(self, verdict: hangs.Verdict) -> None:
        print(f"trainscale: hang: {verdict.text()}\n  hint: {HINT}", file=sys.stderr, flush=True)
        with contextlib.suppress(Exception), self.beat._lock:
            peers.post(self.beat.store, verdict.text(), complete=True)
        for listener in list(self.beat.listeners):
            with contextlib.suppress(Exception):
                listener(verdict)

    def _states(self, now: float, waiting: tuple[Any, float] | None = None) -> dict[int, Any]:
        """Every rank's state as the watcher sees it now (its own fresh; others from the store). ``waiting``:
        this rank knows it waits in a collective (its own timed out): its state says which, whatever its age —
        (where it waits, None: its main thread; how long it waited at least)."""
        out: dict[int, Any] = {}
        for rank, raw in self._read_records().items():
            if not isinstance(raw, dict):
                out[rank] = raw
                continue
            beat = int(raw.get("beat", 0))
            seen = self._seen.get(rank)
            if seen is None or seen[0] != beat:
                self._seen[rank] = seen = (beat, now)
            state = hangs.State.from_record(rank, raw, silent_s=now - seen[1])
            if not state.responsive:
                state.process = _process_state(state.host, state.pid)
                if not state.stacks and state.dump:
                    state.stacks = _read_dump(state.dump)
            out[rank] = state
        own = {**self.beat._record(now), "since": now - self.beat._changed_at}
        state = out[self.beat.rank] = hangs.State.from_record(self.beat.rank, own)
        if waiting is not None:
            frame, at_least = waiting
            if frame is not None:  # its main thread has left the collective: where it waited, not where it is
                state.site = ledger.site(frame)
            frame = frame or ledger.main_frame()
            if not state.ledger:
                state.ledger = ledger.recent(frame=frame) or []
            if not state.wait:  # its collective timed out and was let go: the last one it issued
                state.ledger.append(self._assumed_wait(own, frame, state.site, at_least))
        return out

    def _assumed_wait(self, own: dict[str, Any], frame: Any, site: str | None, at_least: float) -> dict[str, Any]:
        """This rank's collective that timed out, when no flight record holds it: its last one issued."""
        issued = own.get("issued") or {}
        group = max(issued, key=issued.get) if issued else "pg:?"
        op = ledger.waiting_in(frame)
        op = "a collective in backward" if op == "backward" else op or self.beat.op or "a collective"
        return {
            "pg": group,
            "seq": issued.get(group, 0),
            "op": op,
            "sizes": None,
            "site": site,
            "age_s": max(own["since"], at_least),
            "done": False,
            "assumed": True,
        }

    def _read_records(self) -> dict[int, Any]:
        if self.beat.store is None:
            return {}
        previous = None if self.beat._own else self.beat.store.timeout
        if previous is not None:  # the shared connection (torch without Store.clone): put it back below
            self.beat.store.set_timeout(READ_TIMEOUT)
        try:
            keys = [KEY.format(rank=rank) for rank in range(self.beat.world_size)]
            try:  # every rank has published: all records in one request, not two per rank
                with self.beat._lock:
                    raws = self.beat.store.multi_get(keys) if self.beat.store.check(keys) else None
                    if raws is None:  # some rank has not published (yet): one check each
                        raws = [self.beat.store.get(key) if self.beat.store.check([key]) else None for key in keys]
            except Exception:  # the store itself is gone (with rank 0, which hosts it in srun mode)
                return {rank: UNREACHABLE for rank in range(self.beat.world_size)}
            return {rank: json.loads(raw) if raw is not None else None for rank, raw in enumerate(raws)}
        finally:
            if previous is not None:
                self.beat.store.set_timeout(previous)

    # -- at the collective timeout ----------------------------------------------------------------------
    def explain(self, error: BaseException, *, relay: bool = True) -> CollectiveTimeout | None:
        """A CollectiveTimeout naming the ranks it waited for when ``error`` is a collective timeout; with
        ``relay``, the posted diagnosis when a peer that timed out closed its connections (waiting for it a few
        seconds: a peer that crashed posts none); else None."""
        if isinstance(error, CollectiveTimeout):
            return error
        text = f"{type(error).__name__}: {error}"
        if any(marker in text for marker in _TIMEOUT_MARKERS):
            self.beat._stop.set()
            # the main thread has left the collective: where it waited is the error's innermost frame, and it
            # waited the whole timeout (what its own record says may be older: a heartbeat that fell behind)
            frame = _innermost(error)
            timed = any(marker in text for marker in _TIMEOUT_MARKERS if marker != "DistBackendError")
            waited = self.beat.runtime.timeout.total_seconds() if timed else 0.0
            return self._error(self.diagnose_now(frame, waited), waited_s=None)
        if relay and any(marker in text for marker in PEER_CLOSED):
            return self._relay()
        return None

    def diagnose_now(self, frame: Any = None, waited_s: float = 0.0) -> hangs.Verdict | None:
        """This rank waits (its collective failed): the verdict now, asking the culprits for their stacks.
        ``frame``: where it waited, when its main thread has left the collective (else the main thread's);
        ``waited_s``: how long it waited at least (its collective's timeout)."""
        if self.beat.store is None:
            return None
        with contextlib.suppress(Exception):
            self.beat._publish(time.monotonic())
        states = self._states(time.monotonic(), waiting=(frame, waited_s))
        first = hangs.diagnose(states, notice_s=0.0, observer=self.beat.rank)
        if first is None or not first.culprits:
            return first
        # their stacks come with their records once their progress stalled (the heartbeat's stall record, sent within
        # half the collective timeout): wait a few beats for them, not for a rank that stopped responding
        deadline = time.monotonic() + STACKS_WAIT_S
        while time.monotonic() < deadline and any(
            isinstance(states.get(r), hangs.State) and states[r].responsive and not states[r].stacks
            for r in first.culprits
            if r != self.beat.rank
        ):
            time.sleep(self.beat.HEARTBEAT_S / 2)
            states = self._states(time.monotonic(), waiting=(frame, waited_s))
        return hangs.diagnose(states, notice_s=0.0, observer=self.beat.rank)

    def _error(
        self, verdict: hangs.Verdict | None, waited_s: float | None, limit_s: float | None = None, desync: bool = False
    ) -> CollectiveTimeout:
        timeout_s = self.beat.runtime.timeout.total_seconds()
        waited = f" (waited {waited_s:.0f}s)" if waited_s is not None else ""
        what = self.beat.op or "a collective"
        head = (
            f"rank {self.beat.rank}: {what} at step {self.beat.step} did not complete within {timeout_s:.0f}s{waited}"
        )
        if desync:
            head = f"rank {self.beat.rank}: the job was ended at step {self.beat.step} by trainscale's watch"
        elif limit_s is not None:
            head = (
                f"rank {self.beat.rank}: hung — no progress for {waited_s:.0f}s in {what} at step {self.beat.step}, "
                f"the hang timeout is {limit_s:.0f}s (--hang-timeout)"
            )
        if self.beat.stopped:  # and on rank 0 the watch with it: why no notice came before
            head += f" (this rank's heartbeat had stopped writing its record: {self.beat.stopped})"
        if verdict is None:
            text = f"{head} — no rank's heartbeat says who holds it up (their records are unreachable or absent)"
        elif verdict.kind == "stuck":
            text = f"{head} — no rank is behind in steps or in collectives issued: {verdict.text()}"
        else:
            text = f"{head}: {verdict.text()}"
        with contextlib.suppress(Exception), self.beat._lock:
            peers.post(self.beat.store, text, complete=True)
        return CollectiveTimeout(text, hint=HINT)

    def _relay(self) -> CollectiveTimeout | None:
        """A peer closed its connection: if it timed out, it posted its diagnosis, which this rank's error
        carries; a peer that crashed posts none, and the error stays as it was."""
        self.beat._stop.set()
        if self.beat.store is None:
            return None
        try:
            with self.beat._lock:
                found = peers.await_diagnosis(self.beat.store, STACKS_WAIT_S + 2 * self.beat.HEARTBEAT_S)
        except Exception:
            found = None
        if found is None:
            return None
        what = f"rank {self.beat.rank}: {self.beat.op or 'a collective'} at step {self.beat.step} failed"
        return CollectiveTimeout(
            f"{what}: a peer timed out and closed its connections; its diagnosis: {found}", hint=HINT
        )


def _innermost(error: BaseException) -> types.FrameType | None:
    """The innermost frame of ``error``'s traceback (where the call that raised it was), or None."""
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame if tb is not None else None


def _process_state(host: str, pid: int | None) -> str | None:
    """How a silent rank's process is, where the watcher can see it (the same host): stopped or running."""
    if not pid or host not in (socket.gethostname(), node_name()):
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return "gone"
    return {
        "T": "stopped (SIGSTOP or a debugger)",
        "t": "stopped by a debugger",
        "R": "running",
        "D": "in uninterruptible I/O",
        "Z": "exited",
    }.get(fields[0], None)


def _read_dump(path: str, limit: int = 6000) -> str | None:
    """A silent rank's stacks as its C watchdog wrote them (faulthandler: innermost first), its threads only."""
    with contextlib.suppress(OSError):
        blocks = Path(path).read_text(errors="replace").strip().split("\n\n")
        own = [
            b
            for b in blocks
            if "trainscale/runtime/hangwatch/heartbeat.py" not in b and "trainscale/observe/" not in b and "File " in b
        ]
        if own:
            return (
                "(written by its C watchdog while its Python was held; innermost first)\n" + "\n\n".join(own)[-limit:]
            )
    return None


DUMP_WAIT_S = 10.0
"""How long :func:`end_process` waits for NCCL's flight-recorder dump, which a wedged GPU can hold forever."""


def end_process(runtime: Any, error: CollectiveTimeout) -> None:
    """What the watching heartbeat does at the timeout on NCCL: the main thread is stuck where no exception
    can reach it, so report the error as an uncaught one would be, then end the process ourselves.

    In order: the launcher's error file first (torchelastic's format, so `trainscale run` names it in its
    summary, even if what follows hangs on a wedged device), the runtime's timeout callbacks
    (``rt.on_collective_timeout``), the error on stderr, NCCL's flight-recorder trace (best effort, in a
    thread of its own waited for a bounded time), exit status 124 (errors.HUNG_EXIT).
    """
    try:
        raise error  # the stack it records is the one this raise gives it
    except CollectiveTimeout as exc:
        record_error(exc)
    call_timeout_callbacks(getattr(runtime, "timeout_callbacks", ()), error)
    print(f"trainscale: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
    dumping = threading.Thread(target=_dump_flight_recorder, args=(runtime.rank, runtime), daemon=True)
    dumping.start()
    dumping.join(DUMP_WAIT_S)
    sys.stderr.flush()
    os._exit(HUNG_EXIT)


def call_timeout_callbacks(callbacks: Any, error: CollectiveTimeout) -> None:
    for callback in list(callbacks):
        try:
            callback(error)
        except Exception as exc:  # a broken callback must not hide the diagnosis
            print(f"trainscale: timeout callback failed: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)


def use_ranks_gpu(runtime: Any) -> None:
    """On NCCL, make this thread's GPU the rank's: NCCL's flight recorder queries its CUDA events from the thread
    that dumps it, and a new thread's GPU is GPU 0 (a CUDA context there from every rank)."""
    device = getattr(runtime, "device", None)
    if getattr(runtime, "uses_nccl", False) and getattr(device, "type", "") == "cuda":
        with contextlib.suppress(Exception):
            torch.cuda.set_device(device)


def _dump_flight_recorder(rank: int, runtime: Any = None) -> None:
    """Write this rank's NCCL flight-recorder trace where NCCL's own dump on timeout would go.

    Ending the process before NCCL's watchdog means NCCL never dumps it; torch's CUDA builds can
    dump on demand through a private hook, so this is best effort and silent when it is missing.
    """
    prefix = os.environ.get("TORCH_FR_DUMP_TEMP_FILE") or os.environ.get("TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    use_ranks_gpu(runtime)
    try:
        dump = getattr(torch._C._distributed_c10d, "_dump_nccl_trace", None)
        if prefix is None or dump is None:
            return
        with open(f"{prefix}{rank}", "wb") as fh:
            fh.write(dump())
        print(f"trainscale: NCCL flight recorder trace written to {prefix}{rank}", file=sys.stderr, flush=True)
    except Exception:
        return
