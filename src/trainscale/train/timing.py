"""Epoch wall time, and the optional ``--breakdown`` of an epoch into data loading, forward+backward,
gradient communication, optimizer (:class:`StepClock`); the per-step records are the recorder's, the same
for any script (observe/hooks.py). Why both wait for the device and time all-reduces with CUDA events: docs/gpu.md, "Timing";
what each section means: docs/scaling.md, "Reading the breakdown". The breakdown is off by default (its
synchronisations cost a little on GPUs); every section is averaged over the ranks.

Communication is measured by watching DDP's one communication hook (``strategies/comm_hooks.py``): the
``comm_hook=`` chosen, as it is (compression included), else a plain all-reduce the timer registers. A
blocking hook (``comm_hook=shm``) overlaps nothing: all of its time is exposed. On the CPU (gloo) the
timestamps are the host's clock (the hook's future completes when the all-reduce has); on CUDA, events
on the device's timeline: the start on the stream that produced the bucket, the end on the stream the
future's callback runs on (which waits for the all-reduce), read after the section's synchronisation.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from typing import Iterator

import torch

from trainscale.strategies import comm_hooks


class EpochClock:
    """Seconds of work done between :meth:`start` and :meth:`stop`, not of work queued: both ends
    wait for the rank's device (``Runtime.synchronize``; nothing to wait for on the CPU)."""

    def __init__(self, runtime) -> None:
        self.runtime = runtime
        self._started: float | None = None

    def start(self) -> None:
        self.runtime.synchronize()
        self._started = time.perf_counter()

    def stop(self) -> float:
        self.runtime.synchronize()
        return time.perf_counter() - (self._started if self._started is not None else time.perf_counter())


BREAKDOWN_SECTION = {"data": "data", "forward": "compute", "backward": "compute", "optimizer": "optimizer"}
"""Where each phase of a step goes in the epoch's ``--breakdown``: forward and backward are its compute
(backward's exposed communication taken out)."""


class StepClock:
    """The ``--breakdown`` of a training loop's epochs: ``with clock.phase("data" | "forward" | "backward" |
    "optimizer")`` around each phase; :meth:`summary` gives the epoch's seconds per section, each phase timed
    between device synchronisations, DDP's communication hook watched for the all-reduces. Without
    ``breakdown`` every phase is a no-op. (The per-step records are the recorder's: observe/hooks.py.)"""

    def __init__(self, runtime, model, *, breakdown: bool = False) -> None:
        self.breakdown = breakdown
        self.runtime = runtime
        self.device = runtime.device
        self.events = self.device.type == "cuda"  # CUDA events instead of the host clock (see above)
        self.totals: dict[str, float] = defaultdict(float)
        self.comm_total_s = 0.0
        self.buckets = 0  # most all-reduces seen in one step (DDP's gradient buckets)
        self._lock = threading.Lock()
        self._intervals: list[list] = []  # [start, end, blocking] marks of this phase's bucket all-reduces
        self._ref = None  # CUDA: the event every mark of the current phase is timed from
        self.gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        if breakdown and hasattr(model, "register_comm_hook"):  # DDP (compiled or not): watch its one hook
            hook = comm_hooks.attached(model) or comm_hooks.attach(model)
            hook.observer = self

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if name not in BREAKDOWN_SECTION:
            raise ValueError(f"unknown phase {name!r}: one of {', '.join(BREAKDOWN_SECTION)}")
        if not self.breakdown:
            yield
            return
        self._sync()
        with self._lock:
            self._intervals = []
        if self.events:
            self._ref = self._now()
        start = self._now()
        yield
        stop = self._now()
        self._sync()
        start_s, end_s = self._seconds(start), self._seconds(stop)
        exposed = self._exposed(end_s)
        self.totals[BREAKDOWN_SECTION[name]] += end_s - start_s - exposed
        if exposed:
            self.totals["communication"] += exposed

    # -- timestamps -------------------------------------------------------------------------------
    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def _now(self):
        """A timestamp: the host clock, or on CUDA an event recorded on the current stream."""
        if not self.events:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        # On this rank's GPU explicitly: the future's callback may run on a thread whose current
        # device is another one, with the waiting stream set as current for this device only.
        event.record(torch.cuda.current_stream(self.device))
        return event

    def _seconds(self, mark) -> float:
        """A mark in seconds on the phase's timeline (CUDA: from the phase's start; only after the
        synchronisation that ends the phase, when every event has completed)."""
        return mark if isinstance(mark, float) else self._ref.elapsed_time(mark) / 1000.0

    # -- the breakdown ------------------------------------------------------------------------------
    def start_epoch(self) -> None:
        self.totals.clear()
        self.comm_total_s = 0.0

    def _exposed(self, end: float) -> float:
        """Account this phase's all-reduces; return the time spent after the last bucket became ready."""
        with self._lock:
            marks, self._intervals = self._intervals, []
        intervals = [(self._seconds(s), self._seconds(e) if e is not None else end) for s, e, _ in marks]
        if not intervals:
            return 0.0
        self.comm_total_s += _union_length(intervals)
        self.buckets = max(self.buckets, len(intervals))
        # a blocking hook (shm) holds backward up for its whole time; an asynchronous one only after the last bucket
        blocked = [i for i, (_, _, blocking) in zip(intervals, marks) if blocking]
        if blocked:
            return _union_length(blocked)
        last_ready = max(s for s, _ in intervals)
        return max(0.0, min(end, max(e for _, e in intervals)) - last_ready)

    def begin(self, blocking: bool = False) -> list:
        """A bucket's communication was launched (called by the comm hook); its mark for :meth:`end`.
        ``blocking``: the hook returns only when the bucket is done (backward waits for all of it)."""
        interval = [self._now(), None, blocking]
        with self._lock:
            self._intervals.append(interval)
        return interval

    def end(self, interval: list) -> None:
        """That bucket's result is ready (the hook's future completed)."""
        interval[1] = self._now()

    def summary(self) -> dict[str, float] | None:
        """This epoch's seconds per section, averaged over the ranks like the epoch time they divide
        (one rank's sections alone can add up to more than the ranks' mean epoch time). A collective:
        every rank calls it."""
        if not self.breakdown:
            return None
        out = {key: self.totals.get(key, 0.0) for key in ("data", "compute", "communication", "optimizer")}
        out.update({k: v for k, v in sorted(self.totals.items()) if k not in out})
        out["communication_total"] = self.comm_total_s
        out = dict(zip(out, self.runtime.means(list(out.values()))))
        out["communication_overlapped"] = max(0.0, out["communication_total"] - out["communication"])
        out["gradient_bytes"] = self.gradient_bytes
        out["buckets"] = self.buckets
        return out


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, cur_start, cur_end = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_end is None or s > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    if cur_end is not None:
        total += cur_end - cur_start
    return total
