"""What the training loop reports: losses kept on the device until a reader needs them (then handed to
``rt.log`` and the trackers: train/trackers.py), and the run's metrics JSON (``--metrics-out``, the format
``trainscale bench`` and sweeps read).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable

import torch

from trainscale.checkpoint import atomic_write_text

FLUSH_EVERY = 256
"""Most training losses kept on the device between read-backs (when log lines are rare or off)."""


class LossLog:
    """Per-step losses, kept on the device: reading one back (``float(loss)``) waits for the GPU, and
    doing it every micro-step stalls the pipeline. :meth:`flush` reads all pending ones in one transfer,
    when a log line, a checkpoint or the end needs them, and hands each to ``log(values, step)``
    (``rt.log``) when given."""

    def __init__(self, log: Callable[[dict[str, float], int], None] | None = None) -> None:
        self.log = log
        self.last = float("nan")
        self._pending: list[tuple[int, torch.Tensor]] = []

    def add(self, step: int, loss: torch.Tensor) -> None:
        self._pending.append((step, loss))
        if len(self._pending) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> float:
        """The newest loss (NaN before the first), after reading every pending one back."""
        if self._pending:
            values = torch.stack([loss for _, loss in self._pending]).tolist()
            if self.log is not None:
                for (step, _), value in zip(self._pending, values):
                    self.log({"train/loss": value}, step)
            self.last = values[-1]
            self._pending.clear()
        return self.last


def write_metrics(path: str | os.PathLike | None, result: dict[str, Any], runtime: Any) -> None:
    """The run's metrics as JSON, atomically, on rank 0 (``--metrics-out``)."""
    if path and runtime.is_main:
        atomic_write_text(Path(path), json.dumps(result, indent=2, default=str))


def epoch_curves(record: dict[str, Any], held_out: dict[str, float]) -> dict[str, float]:
    """An epoch's record as the trackers' curves: train/, val/ (held-out, ``test_`` dropped) and perf/."""
    curves = {"epoch": record["epoch"], "train/epoch_loss": record["train_loss"], "train/lr": record["lr"],
              "perf/samples_per_s": record["samples_per_s"], "perf/epoch_time_s": record["time_s"],
              **{"val/" + k.removeprefix("test_"): v for k, v in held_out.items()}}
    if "tokens_per_s" in record:
        curves["perf/tokens_per_s"] = record["tokens_per_s"]
    return curves
