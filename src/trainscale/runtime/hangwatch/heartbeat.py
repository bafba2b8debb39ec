"""Every rank's heartbeat, and the hang watch that names who the others wait for — on any script.

Each rank of a process group of two or more has one heartbeat (:class:`Heartbeat`, a daemon thread,
every 0.5 s): it publishes to the job's store what the rank is doing — its step (optimizer steps, from the
recorder's hooks: observe/hooks.py; or ``rt.guard``'s), the collectives it has issued per process group,
where its main thread is — and, once its progress has stalled a few seconds, its collectives in flight
(torch's flight recorder: runtime/hangwatch/ledger.py) and every thread's stack. Rank 0's heartbeat watches (rank 1's,
when rank 0 stops responding): when ranks have waited in one collective for the notice interval
(``TRAINSCALE_HANG_NOTICE``, default 20 s; 0 switches the watch off), it prints ONE notice naming the waiting
ranks and the missing, desynchronised or unresponsive one(s) with host, pid, place and stacks
(runtime/hangwatch/verdict.py), and posts it for the other ranks. Nothing is killed for it: a rank-0 download behind a
barrier gets the notice and goes on — until the hang timeout (``TRAINSCALE_HANG_TIMEOUT``, `--hang-timeout`):
after that long with no progress, a waiting rank ends its process with the verdict (:func:`end_process`, exit
status 124). At the collective timeout the rank whose collective fails ends with that
verdict (:meth:`Watch.explain`: the worker bootstrap for any script, ``rt.guard`` for trainscale's API;
on NCCL, where no exception reaches a waiting main thread, the heartbeat itself: :func:`end_process`).

The bootstrap starts the heartbeat as soon as the script's process group exists (:func:`watch_for_group`).
A rank whose Python holds the GIL cannot beat: a C-level watchdog (``faulthandler``), re-armed every beat,
then writes its stacks to ``<run dir>/hangs/``. How and why: docs/reliability.md, "Hangs".
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import faulthandler
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainscale.env import detect, job_facts, node_name
from trainscale.runtime.hangwatch import ledger
from trainscale.runtime.hangwatch import verdict as hangs
from trainscale.runtime.hangwatch.watch import KEY, READ_TIMEOUT, CollectiveTimeout, Watch, end_process, use_ranks_gpu

NOTICE_VAR = "TRAINSCALE_HANG_NOTICE"
DEFAULT_NOTICE_S = 20.0
"""Seconds ranks wait in one collective before the notice: a hang is named within half a minute of its start."""
HANG_TIMEOUT_VAR = "TRAINSCALE_HANG_TIMEOUT"
DEFAULT_HANG_TIMEOUT_S = 600.0
"""Without `--hang-timeout`: a hang ends the job after 10 minutes with no progress, counted only once the rank's
training steps began (a rank-0 download behind a barrier before training is not a hang)."""
DETAIL_AFTER_S = 3.0
"""A rank whose progress stalled this long publishes its collectives in flight and its stacks (every 2 s)."""
LIVE_S = 2.0
"""A record is published at least this often: its beat count is the watcher's sign of life."""
COUNTS_KEPT = 8
"""Step boundaries whose collective counts a record carries: enough that ranks a few steps apart share some."""
WATCHDOG_S = 8.0
"""A heartbeat silent this long (the GIL held) has the C watchdog write the rank's stacks."""


def notice_interval(environ: Any = os.environ) -> float:
    return _seconds(environ, NOTICE_VAR, DEFAULT_NOTICE_S)


def hang_timeout(environ: Any = os.environ) -> tuple[float, bool]:
    """(seconds with no progress that end the job, 0: never; whether they count before the first training
    step): `--hang-timeout`'s from the first collective on, else :data:`DEFAULT_HANG_TIMEOUT_S` once steps ran."""
    given = str(environ.get(HANG_TIMEOUT_VAR, "")).strip()
    return _seconds(environ, HANG_TIMEOUT_VAR, DEFAULT_HANG_TIMEOUT_S), bool(given)


def _seconds(environ: Any, name: str, default: float) -> float:
    raw = str(environ.get(name, "")).strip()
    try:
        return max(0.0, float(raw)) if raw else default
    except ValueError:
        return default


class GroupView:
    """What the heartbeat needs of a Runtime, read from torch.distributed's default group (a plain script's)."""

    is_distributed = True

    def __init__(self) -> None:
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.backend = str(dist.get_backend())
        self.uses_nccl = "nccl" in self.backend
        timeout = _group_timeout(self.backend)
        # NCCL's own watchdog aborts at the timeout with no word of who was missing: end a little before it
        margin = min(10.0, 0.1 * timeout.total_seconds()) if self.uses_nccl else 0.0
        self.timeout = timeout - datetime.timedelta(seconds=margin)
        self.timeout_callbacks: list = []
        self.device = _group_device() if self.uses_nccl else torch.device("cpu")


def _group_device() -> torch.device:
    """The GPU of this rank's NCCL group: the one it was bound to, else the local rank's (torch's convention)."""
    with contextlib.suppress(Exception):
        bound = dist.group.WORLD.bound_device_id
        if bound is not None:
            return bound
    local_rank = 0
    with contextlib.suppress(Exception):  # a rank's place, as env/ reads it for every launcher
        local_rank = detect().local_rank
    return torch.device("cuda", local_rank % max(1, torch.cuda.device_count()))


def _group_timeout(backend: str) -> datetime.timedelta:
    """The default group's collective timeout (the script's ``init_process_group(timeout=)``)."""
    group = dist.group.WORLD
    for device in ("cuda", "cpu"):
        with contextlib.suppress(Exception):
            return group._get_backend(torch.device(device)).options._timeout
    with contextlib.suppress(Exception):
        return dist.distributed_c10d._get_default_timeout(backend)
    return datetime.timedelta(minutes=30)


def _store() -> Any:
    try:
        return dist.distributed_c10d._get_default_store()
    except (RuntimeError, ValueError, AttributeError):
        return None


def _own_connection(store: Any) -> tuple[Any, bool]:
    """(store, own): a connection of the heartbeat's own with :data:`READ_TIMEOUT` where torch can clone
    one (torch >= 2.5); else the shared one, whose timeout :meth:`Watch._read_records` restores."""
    if store is None:
        return None, False
    try:
        own = store.clone()
        own.set_timeout(READ_TIMEOUT)
        return own, True
    except Exception:
        return store, False


class Heartbeat:
    """One rank's heartbeat thread and, on rank 0 (or rank 1 standing in), the hang watch (runtime/hangwatch/watch.py).

    ``watch`` (default: on NCCL) makes it also end the process itself at the collective timeout
    (``on_hang``, default :func:`end_process`); ``notice_s``: the notice interval (0: no notices)."""

    HEARTBEAT_S = 0.5

    def __init__(
        self,
        runtime: Any,
        *,
        watch: bool | None = None,
        notice_s: float | None = None,
        on_hang: Callable[[CollectiveTimeout], None] | None = None,
        run_dir: str | None = None,
    ) -> None:
        self.runtime = runtime
        self.rank, self.world_size = runtime.rank, runtime.world_size
        self.store, self._own = _own_connection(_store() if runtime.is_distributed else None)
        self.group = dist.group.WORLD if runtime.is_distributed else None
        self.step = -1
        self.op = ""
        self.watch = bool(getattr(runtime, "uses_nccl", False)) if watch is None else watch
        self.notice_s = notice_interval() if notice_s is None else notice_s
        self.hang_timeout = hang_timeout()
        self.on_hang = on_hang or (lambda error: end_process(runtime, error))
        self.listeners: list[Callable[[hangs.Verdict], None]] = []
        """Called with each notice's verdict (the recorder writes it to the run's events)."""
        self.on_stall: list[Callable[[], None]] = []
        """Called once each time this rank's progress stalls a few seconds (the recorder writes its records out:
        a rank ended by the launcher after a hang keeps its steps)."""
        self.issued: Callable[[], dict[str, int]] = ledger.issued
        self.host, self.pid = node_name(), os.getpid()
        self.counts: collections.deque = collections.deque(maxlen=COUNTS_KEPT)
        """[step, collectives issued on the default group by its end], written at each optimizer step."""
        self._beats = 0
        self._progress: tuple | None = None
        self._changed_at = time.monotonic()
        self._detail: tuple[float, dict] | None = None
        self._published: tuple[str, float] | None = None
        self.stopped: str | None = None
        """Why its thread stopped writing its record while the job ran (the store's error), or None."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._dump_file = _watchdog_file(run_dir, self.rank)
        self.dump_path = self._dump_file.name if self._dump_file is not None else None
        self.watcher = Watch(self)

    # -- the step -----------------------------------------------------------------------------------
    def mark(self, step: int, op: str = "") -> None:
        """``rt.guard``'s: this rank is at ``step``, doing ``op``. Starts the thread on the first call."""
        self.step, self.op = step, op or self.op
        self.start()

    def start(self) -> Heartbeat:
        if self.store is not None and self._thread is None:
            self._publish(time.monotonic())
            self._thread = threading.Thread(target=self._beat, name="trainscale-heartbeat", daemon=True)
            self._thread.start()
        return self

    @property
    def beating(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def since(self) -> float:
        return time.monotonic() - self._changed_at

    # -- publishing -----------------------------------------------------------------------------------
    def _record(self, now: float) -> dict[str, Any]:
        progress = (self.step, self.issued())
        if progress != self._progress:
            self._progress, self._changed_at, self._detail = progress, now, None
        since = now - self._changed_at
        frame = ledger.main_frame()
        record = {
            "step": self.step,
            "op": self.op,
            "issued": progress[1],
            "site": ledger.site(frame),
            "host": self.host,
            "pid": self.pid,
            "dump": self.dump_path,
            "counts": list(self.counts),
        }
        background = ledger.own_groups()
        if background:  # left out of "issued" and the ledger: named, so a reader knows they exist
            record["background_groups"] = background
        timeout = getattr(self.runtime, "timeout", None)  # a shorter collective timeout than that: half of it
        if since >= min(DETAIL_AFTER_S, timeout.total_seconds() / 2 if timeout else DETAIL_AFTER_S):
            if self._detail is None:
                for call in list(self.on_stall):
                    with contextlib.suppress(Exception):
                        call()
            if self._detail is None or now - self._detail[0] >= LIVE_S:
                self._detail = (
                    now,
                    {"ledger": self._ledger(frame, progress[1], record["site"], since), "stacks": ledger.stacks()},
                )
            record.update(self._detail[1])
        return record

    def _ledger(self, frame: Any, issued: dict[str, int], site: str | None, since: float) -> list[dict[str, Any]]:
        """This rank's last collectives; without a flight recorder, the one its main thread waits in."""
        found = ledger.recent(frame=frame)
        if found is not None:
            return found
        op = ledger.waiting_in(frame)
        group = min(issued, default=None)
        return (
            [{"pg": group, "seq": issued[group], "op": op, "sizes": None, "site": site, "age_s": since, "done": False}]
            if op and group
            else []
        )

    def _publish(self, now: float, record: dict[str, Any] | None = None) -> dict[str, Any] | None:
        if self.store is None:
            return None
        record = self._record(now) if record is None else record
        text = json.dumps(record, default=str)
        if self._published and self._published[0] == text and now - self._published[1] < LIVE_S:
            return record
        self._beats += 1
        with self._lock:
            self.store.set(
                KEY.format(rank=self.rank),
                json.dumps({**record, "beat": self._beats, "since": round(now - self._changed_at, 2)}, default=str),
            )
        self._published = (text, now)
        return record

    def _beat(self) -> None:
        use_ranks_gpu(self.runtime)  # before NCCL's flight recorder is read from this thread
        while not self._stop.wait(self.HEARTBEAT_S):
            try:
                if self.group is not None and not _alive(self.group):
                    self.stopped = "its process group was no longer in torch's list of groups"  # (Watch._error)
                    return  # the group was destroyed (the script closed it): nothing left to watch
                now = time.monotonic()
                self._rearm_watchdog()
                record = self._record(now)
            except Exception as exc:  # a bug in the record must not pass for a rank that stopped responding
                if self.group is not None and not _alive(self.group):  # destroyed meanwhile: the run's end
                    self.stopped = "its process group was no longer in torch's list of groups"
                elif not self._stop.is_set():
                    _stopped("heartbeat", exc)
                return
            try:
                self._publish(now, record)
            except Exception as exc:  # the store went away (teardown, rank 0 gone): stop quietly, saying why to a
                self.stopped = f"{type(exc).__name__}: {str(exc)[:200]}"  # verdict of this rank's (Watch._error)
                return
            try:
                self.watcher.look(now)
            except Exception as exc:  # a bug in the watch must not pass for "no hang": say so, once
                _stopped("hang watch", exc)
                return

    # -- the end --------------------------------------------------------------------------------------
    def close(self, timeout_s: float = 5.0) -> None:
        """Stop the heartbeat and wait for it (bounded: a store that hangs cannot hold up the exit).

        A daemon thread still inside a store call when the interpreter shuts down is ended inside C++
        code, and the process dies with "terminate called without an active exception" (SIGABRT)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
        if self._dump_file is not None:
            with contextlib.suppress(Exception):
                faulthandler.cancel_dump_traceback_later()
                empty = not self._dump_file.tell()
                self._dump_file.close()
                if empty:  # nothing was held up: leave no file behind
                    os.unlink(self._dump_file.name)
                    with contextlib.suppress(OSError):
                        os.rmdir(os.path.dirname(self._dump_file.name))
        global _heartbeat
        if _heartbeat is self:
            _heartbeat = None

    def _rearm_watchdog(self) -> None:
        if self._dump_file is None:
            return
        if self._dump_file.tell():  # it fired while this thread was held up, and the rank went on: stale
            self._dump_file.seek(0)
            self._dump_file.truncate()
        faulthandler.dump_traceback_later(WATCHDOG_S, repeat=False, file=self._dump_file)


def _stopped(what: str, exc: Exception) -> None:
    import traceback  # noqa: PLC0415 (only on this path)

    print(
        f"trainscale: the {what} stopped: {type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}",
        file=sys.stderr,
        flush=True,
    )


def _alive(group: Any) -> bool:
    try:
        return dist.is_initialized() and group in dist.distributed_c10d._world.pg_map
    except Exception:
        return False


def _watchdog_file(run_dir: str | None, rank: int) -> Any:
    if not run_dir:
        return None
    try:
        path = Path(run_dir) / "hangs" / f"stacks-rank{rank}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        return open(path, "wb+")
    except OSError:
        return None


# -- the process's heartbeat ------------------------------------------------------------------------------
_heartbeat: Heartbeat | None = None


def current() -> Heartbeat | None:
    return _heartbeat


def note_step(step: int) -> None:
    """The recorder's hooks: this rank finished optimizer step ``step``."""
    beat = _heartbeat
    if beat is not None:
        beat.step = step
        # a counter read in memory (no system call): the watcher compares these across ranks
        # (runtime/hangwatch/watch.py); try, not contextlib.suppress: three Python calls less each step
        try:
            beat.counts.append([step, int(beat.group._get_sequence_number_for_group())])
        except Exception:
            pass


def for_runtime(runtime: Any) -> Heartbeat:
    """``rt.guard``'s heartbeat: the process's own when it watches this runtime's group, else a new one."""
    global _heartbeat
    beat = _heartbeat
    if beat is not None and runtime.is_distributed and beat.group is dist.group.WORLD and beat.beating:
        beat.runtime = runtime
        beat.watch = bool(getattr(runtime, "uses_nccl", False))
        return beat
    beat = Heartbeat(runtime, run_dir=getattr(getattr(runtime, "env", None), "run_dir", None))
    if runtime.is_distributed:
        _heartbeat = beat
    return beat


def start_for_group(environ: Any = os.environ, listeners: tuple = (), on_stall: tuple = ()) -> Heartbeat | None:
    """The process's heartbeat for the default process group, started now (two or more ranks), once."""
    global _heartbeat
    if _heartbeat is not None and _heartbeat.group is dist.group.WORLD:
        return _heartbeat
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    beat = Heartbeat(GroupView(), run_dir=job_facts(environ)["run_dir"])
    beat.listeners.extend(listeners)
    beat.on_stall.extend(on_stall)
    beat.watch = beat.watch and beat.notice_s > 0  # NCCL: end with the verdict before NCCL's watchdog aborts
    _heartbeat = beat.start()
    return beat


class GroupWatch:
    """A daemon thread that starts the heartbeat when the script's process group appears (and again for a
    new one): nothing to call from the script."""

    def __init__(self, environ: Any = os.environ, listeners: tuple = (), on_stall: tuple = ()) -> None:
        self.environ, self.listeners, self.on_stall = environ, listeners, on_stall
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trainscale-groupwatch", daemon=True)

    def start(self) -> GroupWatch:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(0.25):
            with contextlib.suppress(Exception):
                start_for_group(self.environ, self.listeners, self.on_stall)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(2.0)
        beat = _heartbeat
        if beat is not None:
            beat.close()
