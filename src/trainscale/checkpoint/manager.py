"""Save on rank 0, resume everywhere: model, optimizer, scheduler, loop counters, RNG and sampler state.

Files are ``ckpt-<step>.pt`` in one directory. The newest one that loads wins; an incomplete or
corrupt file is skipped with a warning. Loading uses ``weights_only=True``: a checkpoint cannot run code.
"""

from __future__ import annotations

import logging
import pickle
import re
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from trainscale._version import __version__
from trainscale.checkpoint.atomic import atomic_torch_save
from trainscale.errors import CheckpointError

log = logging.getLogger("trainscale.checkpoint")
FORMAT = 1
_NAME = re.compile(r"^ckpt-(\d{8,})\.pt$")
_SHARDED_NAME = re.compile(r"^ckpt-(\d{8,})$")  # a directory: see checkpoint/sharded.py


@dataclass(frozen=True)
class Found:
    path: Path
    step: int
    state: dict[str, Any]


def checkpoint_path(directory: Path, step: int) -> Path:
    return Path(directory) / f"ckpt-{step:08d}.pt"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) for every checkpoint file (and sharded checkpoint directory), newest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in directory.iterdir()
             if (m := _NAME.match(p.name)) or (p.is_dir() and (m := _SHARDED_NAME.match(p.name)))]
    return sorted(found, reverse=True)


def read_torch_file(path: Path, map_location: str | torch.device = "cpu") -> Any:
    """``torch.load(weights_only=True)``; CheckpointError says why the file cannot be used."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path} holds objects that are not plain tensors/containers and was refused: {str(exc).splitlines()[0]}",
            hint="only load checkpoints you trust; trainscale never unpickles arbitrary objects",
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is unreadable (truncated or corrupt): {str(exc).splitlines()[0]}",
                              hint="delete it; the previous checkpoint will be used") from None
    return state


def load_file(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """Load one checkpoint file safely; CheckpointError says why it cannot be used."""
    state = read_torch_file(path, map_location)
    if not isinstance(state, dict) or state.get("trainscale", {}).get("complete") is not True:
        raise CheckpointError(f"{path} is not a complete trainscale checkpoint", hint="delete it or point --resume elsewhere")
    return state


def find_latest(directory: Path, map_location: str | torch.device = "cpu") -> Found | None:
    """The newest checkpoint that loads; broken newer ones are reported and skipped."""
    for step, path in list_checkpoints(directory):
        try:
            if path.is_dir():
                from trainscale.checkpoint.sharded import open_checkpoint

                return Found(path, step, open_checkpoint(path))
            return Found(path, step, load_file(path, map_location))
        except CheckpointError as exc:
            log.warning("skipping checkpoint: %s", exc)
    return None


class Checkpointer:
    """Rank-0 checkpoints with the barriers the seeds describe, kept to the newest ``keep`` files.

    ``strategy`` is a name or a strategy object; one with ``sharded_checkpoint`` (fsdp, deepspeed)
    makes every rank write its shards instead (checkpoint/sharded.py), behind the same save/latest.
    """

    def __init__(self, directory: str | Path, runtime: Any, *, keep: int = 2, strategy: Any = "ddp") -> None:
        if keep < 1:
            raise CheckpointError(f"keep={keep} must be >= 1", hint="keep at least the newest checkpoint")
        self.directory = Path(directory)
        self.runtime = runtime
        self.keep = keep
        self.strategy = strategy if isinstance(strategy, str) else strategy.name
        self.sharded = bool(getattr(strategy, "sharded_checkpoint", False))

    def save(self, step: int, state: dict[str, Any]) -> Path:
        """Every rank calls this; rank 0 writes (every rank, for sharded strategies). Returns the path
        (on every rank)."""
        if self.sharded:
            from trainscale.checkpoint import sharded

            meta = {"world_size": self.runtime.world_size, "strategy": self.strategy}
            path = sharded.save(self.directory, step, state, self.runtime, meta)
            if self.runtime.is_main:
                self._prune()
            self.runtime.barrier()
            return path
        path = checkpoint_path(self.directory, step)
        self.runtime.barrier()  # everybody has finished the step that is being saved
        if self.runtime.is_main:
            payload = dict(state)
            payload["trainscale"] = {
                "format": FORMAT,
                "version": __version__,
                "world_size": self.runtime.world_size,
                "strategy": self.strategy,
                "step": step,
                "complete": True,
            }
            atomic_torch_save(payload, path)
            self._prune()
        self.runtime.barrier()  # nobody runs ahead (or exits) before the file is on disk
        return path

    def _prune(self) -> None:
        for _, old in list_checkpoints(self.directory)[self.keep:]:
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)
        for stale in self.directory.glob(".ckpt-*.partial"):  # sharded saves that never completed
            shutil.rmtree(stale, ignore_errors=True)
        # Temp files of a save that was killed midway: never complete, never loaded, now removed.
        for stale in self.directory.glob(".ckpt-*.tmp"):
            stale.unlink(missing_ok=True)

    def latest(self) -> Found | None:
        found = find_latest(self.directory, map_location="cpu")
        if found is not None:
            meta = found.state["trainscale"]
            if meta.get("strategy") not in (None, self.strategy):
                raise CheckpointError(
                    f"{found.path} was written by strategy {meta['strategy']!r}, this run uses {self.strategy!r}",
                    hint=f"resume with --strategy {meta['strategy']}, or start a new checkpoint directory",
                )
        return found
