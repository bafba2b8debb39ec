"""The one clock of a step: timestamps at the edges of its phases, turned into one record per optimizer step.

Whoever sees a phase end says so with :meth:`StepMarks.mark` — the recorder's hooks (observe/hooks.py) for any
script: the top-level module's forward, the end of backward, the optimizer's step. The interval since the
previous mark (or the step's start) is the phase that ended, so the phases add up to the step:

    data       waiting for the batch and the host's own work before the first forward (``data_s``)
    forward    the top-level modules' forward passes (``compute_s``)
    between    host work between forward and backward: the loss, nanoGPT's fetch of its next batch (``between_s``)
    backward   backward's own computing, up to its end (``backward_s``)
    sync       the wait at backward's end for the gradient all-reduces (DDP's): exposed communication (``comm_s``),
               with every wait for a collective inside the other phases (:meth:`StepMarks.waited`: FSDP's
               all-gathers in forward, ZeRO's broadcasts in the optimizer step), taken out of the phase it fell in
    optimizer  the optimizer's step (``optimizer_s``)
    other      host work between backward and the optimizer (clipping, logging): in no field, the report's "other"

Repeated phases (accumulated micro-batches) add up. No device synchronisation: on a GPU each mark is a CUDA
event on the current stream, read ``lag`` steps later when it has completed; on a CPU the host clock. While the
script captures a CUDA graph (``torch.cuda.is_current_stream_capturing()``) nothing is recorded or queried: an
event recorded there would become part of the user's graph, and a query fails the capture.
"""

from __future__ import annotations

import time
from typing import Any

RECORD_FIELD = {
    "data": "data_s",
    "forward": "compute_s",
    "between": "between_s",
    "backward": "backward_s",
    "sync": "comm_s",
    "optimizer": "optimizer_s",
    "other": None,
}
"""Each phase's field in a step record (observe/records.py); ``other`` is left to the report."""
_FIELDS = [field for field in RECORD_FIELD.values() if field]


class StepMarks:
    """Marks of the step in progress, and the finished steps waiting for their times."""

    def __init__(self, device: Any = None, *, lag: int = 2) -> None:
        self.events = getattr(device, "type", "cpu") == "cuda"
        self.device, self.lag = device, lag
        self._now = self._event if self.events else time.perf_counter
        self._marks: list[tuple[str, Any]] = []
        """One list for the rank's life (its contents replaced at once, by a slice): the recorder's hot path
        appends to it through a bound ``append`` it keeps (observe/hooks.py)."""
        self._waits: list[tuple[int, float]] = []
        """(the index in ``_marks`` of the mark that ends the phase it fell in, seconds): kept apart, so that a
        mark, a few a micro-batch, touches nothing else."""
        self._pending: list[tuple[dict, list[tuple[str, Any]], list[tuple[int, float]]]] = []

    def start_step(self) -> None:
        if not (self.events and self._capturing()):
            self._marks[:], self._waits = [("start", self._now())], []

    @property
    def started(self) -> bool:
        return bool(self._marks)

    def mark(self, phase: str) -> None:
        """``phase`` (one of :data:`RECORD_FIELD`) ended now. Called a few times a micro-batch: nothing checked."""
        if self.events and self._capturing():  # the phase runs on into the next mark after the capture
            return
        if not self._marks:
            self.start_step()
        self._marks.append((phase, self._now()))

    def waited(self, seconds: float) -> None:
        """The host waited ``seconds`` for a collective inside the phase in progress: communication, not the
        phase's (a rank that waits in its forward for a late rank's all-gather did not compute then). On the
        host clock only: on a GPU a collective's wait is the stream's, which the host does not see."""
        if self._marks and not self.events:
            at, waits = len(self._marks), self._waits
            if waits and waits[-1][0] == at:  # another in the same phase (an evaluation's all-gathers): one entry
                waits[-1] = (at, waits[-1][1] + seconds)
            else:
                waits.append((at, seconds))

    def end_step(self, fields: dict[str, Any], *, carry: bool = False) -> None:
        """The step ends at its last mark; ``fields`` go into its record as they are. ``carry``: the next
        step starts where this one ended (the time since is the next step's, and so are the collectives waited
        for since: DeepSpeed's all-gather after its optimizer's step, a loss all-reduced for logging)."""
        marks, waits = self._marks, self._waits
        if len(marks) > 1:
            self._pending.append((fields, marks.copy(), waits))
        if carry and marks:
            self._waits = [(1, seconds) for at, seconds in waits if at >= len(marks)] if waits else []  # since the last
            marks[:] = [("start", marks[-1][1])]
        else:
            self._waits = []
            marks.clear()

    def ready(self, *, flush: bool = False) -> list[dict[str, Any]]:
        """Finished steps as records; on a GPU those whose last event completed, and every step older
        than ``lag`` (waiting on an event that old costs nothing in practice), or all with ``flush``."""
        out = []
        while self._pending and not self._capturing():
            fields, marks, waits = self._pending[0]
            last = marks[-1][1]
            if self.events and not (flush or len(self._pending) > self.lag or last.query()):
                break
            if self.events:
                last.synchronize()
            self._pending.pop(0)
            out.append({**fields, **self._durations(marks, waits)})
        return out

    def _durations(self, marks: list[tuple[str, Any]], waits: list[tuple[int, float]]) -> dict[str, float]:
        if self.events:  # the events' intervals in seconds, then added up as a host clock's would be
            first = marks[0][1]
            marks = [(phase, first.elapsed_time(at) / 1000.0) for phase, at in marks]
        waited = [0.0] * len(marks)
        for at, seconds in waits:
            if at < len(marks):  # one after the last mark is the next step's
                waited[at] += seconds
        out = dict.fromkeys(_FIELDS, 0.0)
        before = marks[0][1]
        for (phase, after), wait in zip(marks[1:], waited[1:]):
            if wait:
                out["comm_s"] += wait
            field = RECORD_FIELD[phase]
            if field:
                out[field] += after - before - wait
            before = after
        out["step_s"] = before - marks[0][1]
        return out

    def _capturing(self) -> bool:
        if not self.events:
            return False
        import torch  # noqa: PLC0415 (job kit)

        return torch.cuda.is_current_stream_capturing()

    def _event(self) -> Any:
        import torch  # noqa: PLC0415 (job kit)

        event = torch.cuda.Event(enable_timing=True)
        # on this rank's GPU explicitly: a mark may come from a thread whose current device is another one
        # (the autograd engine's, at the end of backward)
        event.record(torch.cuda.current_stream(self.device))
        return event
