"""What the training loop reports: losses kept on the device until a reader needs them, per-rank
metric streams, and the run's metrics JSON (``--metrics-out``, the format ``trainscale bench`` and
sweeps read).

Metric streams (seed 003's habit) are grouped under one experiment: a TensorBoard event file per
rank under ``<experiment>/tensorboard/rank<N>`` and, when wandb is installed, one offline wandb run
per rank in a group named after the experiment. Either backend is optional.
"""

from __future__ import annotations

import json
import os
import re
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
    when a log line, a checkpoint or the end needs them, and hands them to the metric streams."""

    def __init__(self, streams: "MetricStreams | None" = None) -> None:
        self.streams = streams
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
            if self.streams is not None:
                for (step, _), value in zip(self._pending, values):
                    self.streams.add_scalar("train/loss", value, step)
            self.last = values[-1]
            self._pending.clear()
        return self.last


def write_metrics(path: str | os.PathLike | None, result: dict[str, Any], runtime: Any) -> None:
    """The run's metrics as JSON, atomically, on rank 0 (``--metrics-out``): a new file gets the mode
    ``open()`` would give it (0666 less the umask), a file brought up to date by a resumed run keeps
    its own."""
    if path and runtime.is_main:
        text = json.dumps(result, indent=2, default=str).encode()
        atomic_write(Path(path), lambda fh: fh.write(text), mode=_mode_for(Path(path)))


def check_metrics_out(path: str | os.PathLike | None, *, resuming: bool) -> None:
    """Before launch: ``--metrics-out`` must not name a file that exists, unless this run resumes the
    run that wrote it (its checkpoint directory holds a checkpoint): a finished run's results are
    never overwritten by another run's."""
    if not path:
        return
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"--metrics-out {path} is a directory", hint="give the path of a JSON file to write")
    if target.exists() and not resuming:
        raise ConfigError(f"--metrics-out {path} already exists and this run does not resume the one that wrote it",
                          hint="give a new file, move the old one away, or resume that run (the same "
                               "--checkpoint-dir, or --experiment-dir for gpt)")


def _mode_for(path: Path) -> int:
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    try:  # Linux says it without changing it
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class MetricStreams:
    """``add_scalar(tag, value, step)`` to every available backend; ``close()`` ends them all."""

    def __init__(self, directory: Path, rank: int, group: str, run_id: str | None = None) -> None:
        """``run_id``: the experiment's own random id, so two experiments in directories of the same
        name never resume each other's wandb runs (the group name is used without it)."""
        self.tensorboard: Any = None
        self.wandb_run: Any = None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # tensorboard is not installed
            pass
        else:
            self.tensorboard = SummaryWriter(log_dir=str(Path(directory) / "tensorboard" / f"rank{rank}"))
        try:
            import wandb
        except ImportError:
            return
        # Offline unless the user chose a mode: ranks on compute nodes usually have no network.
        mode = os.environ.get("WANDB_MODE", "offline")
        self.wandb_run = wandb.init(project="trainscale", group=group, name=f"rank{rank}", dir=str(directory),
                                    mode=mode, resume="allow", id=re.sub(r"[^A-Za-z0-9_-]", "_", f"{run_id or group}-rank{rank}"))

    @property
    def backends(self) -> list[str]:
        return [name for name, b in (("tensorboard", self.tensorboard), ("wandb", self.wandb_run)) if b is not None]

    def add_scalar(self, tag: str, value: float, step: int) -> None:
        if self.tensorboard is not None:
            self.tensorboard.add_scalar(tag, value, step)
        if self.wandb_run is not None:
            self.wandb_run.log({tag: value}, step=step)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb_run is not None:
            self.wandb_run.finish()
