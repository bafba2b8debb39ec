"""What the training loop reports: losses kept on the device until a reader needs them (then handed to
``rt.log`` and the trackers: train/trackers.py), and the run's metrics JSON (``--metrics-out``, the format
``trainscale bench`` and sweeps read).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainscale.checkpoint import atomic_write
from trainscale.errors import ConfigError

FLUSH_EVERY = 256
"""Most training losses kept on the device between read-backs (when log lines are rare or off)."""


class LossLog:
    """Per-step losses, kept on the device: reading one back (``float(loss)``) waits for the GPU, and
    doing it every micro-step stalls the pipeline. :meth:`flush` reads all pending ones in one transfer,
    when a log line, a checkpoint or the end needs them, and hands each to ``log(values, step)``
    (``rt.log``) when given."""

    def __init__(self, log: Callable[..., None] | None = None) -> None:
        self.log = log
        self.last = float("nan")
        self._pending: list[tuple[int, torch.Tensor, float]] = []

    def add(self, step: int, loss: torch.Tensor) -> None:
        self._pending.append((step, loss, time.time()))  # each value keeps its step's time, not the read-back's
        if len(self._pending) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> float:
        """The newest loss (NaN before the first), after reading every pending one back."""
        if self._pending:
            values = torch.stack([loss for _, loss, _ in self._pending]).tolist()
            if self.log is not None:
                for (step, _, at), value in zip(self._pending, values):
                    self.log({"train/loss": value}, step, at=at)
            self.last = values[-1]
            self._pending.clear()
        return self.last


WRITTEN_FOR = "checkpoints_of"
"""The field of a metrics file that names the directory whose checkpoints its run saved and resumed."""


def write_metrics(
    path: str | os.PathLike | None, result: dict[str, Any], runtime: Any, checkpoints: str | os.PathLike | None = None
) -> None:
    """The run's metrics as JSON, atomically, on rank 0 (``--metrics-out``), with the directory of the run's
    ``checkpoints`` (a resumed run may bring the file up to date: :func:`check_metrics_out`). A new file gets
    the mode ``open()`` would give it (0666 less the umask), a file brought up to date keeps its own."""
    if path and runtime.is_main:
        written = {**result, WRITTEN_FOR: str(Path(checkpoints).resolve()) if checkpoints else None}
        text = json.dumps(written, indent=2, default=str).encode()
        atomic_write(Path(path), lambda fh: fh.write(text), mode=_mode_for(Path(path)))


def check_metrics_out(
    path: str | os.PathLike | None, *, resuming: bool, checkpoints: str | os.PathLike | None = None
) -> None:
    """Before launch: ``--metrics-out`` must not name a file that exists, unless this run resumes the run that
    wrote it — it resumes from ``checkpoints`` and the file says it was written for those checkpoints: a file of
    your own, or another run's results, is never overwritten."""
    if not path:
        return
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"--metrics-out {path} is a directory", hint="give the path of a JSON file to write")
    if not target.exists():
        return
    try:
        written_for = json.loads(target.read_text()).get(WRITTEN_FOR)
    except (OSError, ValueError, AttributeError):
        written_for = None
    ours = resuming and checkpoints is not None and written_for == str(Path(checkpoints).resolve())
    if not ours:
        raise ConfigError(
            f"--metrics-out {path} already exists and this run does not resume the one that wrote it",
            hint="give a new file, move the old one away, or resume that run (the same "
            "--checkpoint-dir, or --experiment-dir for gpt)",
        )


def _mode_for(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    with contextlib.suppress(OSError, ValueError, IndexError):  # Linux says it without changing it
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def epoch_curves(record: dict[str, Any], held_out: dict[str, float]) -> dict[str, float]:
    """An epoch's record as the trackers' curves: train/, val/ (held-out, ``test_`` dropped) and perf/."""
    curves = {
        "epoch": record["epoch"],
        "train/epoch_loss": record["train_loss"],
        "train/lr": record["lr"],
        "perf/samples_per_s": record["samples_per_s"],
        "perf/epoch_time_s": record["time_s"],
        **{"val/" + k.removeprefix("test_"): v for k, v in held_out.items()},
    }
    if "tokens_per_s" in record:
        curves["perf/tokens_per_s"] = record["tokens_per_s"]
    return curves
