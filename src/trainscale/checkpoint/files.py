"""Rank-0 checkpoint files: one ``torch.save``'d dict per step, written atomically, read with
``weights_only=True`` (a checkpoint cannot run code). The layout is in layout.py."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any, Callable

import torch

from trainscale.checkpoint import layout
from trainscale.checkpoint.atomic import atomic_torch_save
from trainscale.errors import CheckpointError


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
    """One complete checkpoint file; CheckpointError says why it cannot be used."""
    state = read_torch_file(path, map_location)
    if not isinstance(state, dict) or state.get(layout.RECORD, {}).get("complete") is not True:
        raise CheckpointError(f"{path} is not a complete trainscale checkpoint", hint="delete it or point --resume elsewhere")
    return state


def save_file(directory: Path, step: int, state: dict[str, Any], record: dict[str, Any], *,
              before_rename: Callable[[], None] | None = None) -> Path:
    """Rank 0 only: ``state`` plus its record, atomically (temp file, fsync, rename, fsync directory).
    ``before_rename``: called once the temporary file is written (a test hook's place)."""
    path = layout.file_path(directory, step)
    atomic_torch_save({**state, layout.RECORD: record}, path, before_rename=before_rename)
    return path
