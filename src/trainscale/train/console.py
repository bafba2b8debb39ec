"""Rank 0's progress lines: where the run is, how fast it goes, and when it will end.

A line (seed 004's ``Train Epoch: ... Loss: ...``, plus what a long run needs)::

    Train Epoch: 2/5 |########------------| [5632/14080 (40%)]  Loss: 0.412345  2,310 samples/s  step 62/220  ETA 1:05

comes every ``--log-every`` optimizer steps when given, else every ``interval_s`` seconds (so a
short epoch prints none and a day-long one prints a line a minute apart at most, whatever its step
time). The rate is over the steps since the previous line; the ETA is the run's remaining steps at
the mean step time since its first step (which pays for warm-up and is left out). Only rank 0 prints,
and nothing here is a collective: ranks need not agree on when a line is due.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

INTERVAL_S = 30.0
"""Seconds between progress lines when ``--log-every`` is not given."""


@dataclass
class Progress:
    steps_per_epoch: int
    """Optimizer steps in one epoch."""
    total: int
    """Optimizer steps of the whole run (after --max-steps)."""
    samples_per_step: int
    """Samples of one optimizer step over every rank."""
    epochs: int | None
    """Epochs of the run, or None when --max-steps may run past them (a language model)."""
    every: int | None = None
    """--log-every: a line every N steps (0: never); None: by time."""
    interval_s: float = INTERVAL_S
    clock: Callable[[], float] = time.monotonic
    _origin: tuple[int, float] | None = field(default=None, init=False)
    _last: tuple[int, float] | None = field(default=None, init=False)

    def due(self, step: int, done: int) -> bool:
        """After optimizer step ``step`` (``done`` of this epoch): is a line due? Call it every step."""
        now = self.clock()
        if self._origin is None:  # the first step of this attempt: warm-up, the clock starts after it
            self._origin = self._last = (step, now)
            return bool(self.every) and step % self.every == 0
        if self.every is not None:
            return self.every > 0 and step % self.every == 0
        if done >= self.steps_per_epoch:  # the loop's epoch line says it all: the interval starts again
            self._last = (step, now)
            return False
        return now - self._last[1] >= self.interval_s

    def line(self, epoch: int, done: int, step: int, loss: float) -> str:
        """The line for ``epoch`` (0-based) after ``done`` of its steps, run step ``step``."""
        now = self.clock()
        fraction = done / self.steps_per_epoch
        of = f"/{self.epochs}" if self.epochs else ""
        text = (
            f"Train Epoch: {epoch + 1}{of} {progress_bar(fraction)} [{done * self.samples_per_step}/"
            f"{self.steps_per_epoch * self.samples_per_step} ({fraction:.0%})]  Loss: {loss:.6f}"
        )
        last_step, last_time = self._last or (step, now)
        if step > last_step and now > last_time:
            text += f"  {(step - last_step) * self.samples_per_step / (now - last_time):,.0f} samples/s"
        text += f"  step {step}/{self.total}"
        eta = self.eta(step, now)
        if eta is not None:
            text += f"  ETA {duration(eta)}"
        self._last = (step, now)
        return text

    def eta(self, step: int, now: float | None = None) -> float | None:
        """Seconds until the run's last step at the mean pace since the first one; None before it is known."""
        if self._origin is None:
            return None
        now = self.clock() if now is None else now
        first_step, first_time = self._origin
        if step <= first_step or now <= first_time:
            return None
        return (self.total - step) * (now - first_time) / (step - first_step)


def progress_bar(fraction: float, width: int = 20) -> str:
    """A bar that reads well in a log file too (rank 0's output is usually redirected)."""
    filled = int(round(max(0.0, min(1.0, fraction)) * width))
    return "|" + "#" * filled + "-" * (width - filled) + "|"


def duration(seconds: float) -> str:
    """``1:05``, ``2:03:04`` (hours), ``3d 2:03:04``."""
    seconds = int(round(max(0.0, seconds)))
    days, seconds = divmod(seconds, 86400)
    hours, seconds = divmod(seconds, 3600)
    minutes, seconds = divmod(seconds, 60)
    text = f"{hours}:{minutes:02d}:{seconds:02d}" if hours or days else f"{minutes}:{seconds:02d}"
    return f"{days}d {text}" if days else text
