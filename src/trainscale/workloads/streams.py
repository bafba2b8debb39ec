"""Per-rank metric streams grouped under one experiment (seed 003's habit): a TensorBoard event
file per rank under ``<experiment>/tensorboard/rank<N>`` and, when wandb is installed, one offline
wandb run per rank in a group named after the experiment. Either backend is optional."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any


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
