"""Rank-0 checkpoint files: one ``torch.save``'d dict per step and its manifest beside it (layout.py),
written atomically and hashed as they are written; read back only when the manifest matches, with
``weights_only=True`` (a checkpoint cannot run code)."""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

from trainscale.checkpoint import disk, integrity, layout
from trainscale.checkpoint.atomic import atomic_torch_save, atomic_write_text
from trainscale.checkpoint.integrity import AGAIN
from trainscale.errors import CheckpointError


def _first_line(exc: BaseException) -> str:
    """The first line of an exception's message, or its type when it has none (an empty EOFError)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _why_refused(exc: BaseException) -> str:
    """The line of torch's weights_only refusal that names what was refused (the first is boilerplate)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if len(lines) > 1 and lines[0].startswith("Weights only load failed"):
        return lines[1]
    return lines[0] if lines else type(exc).__name__


def read_torch_file(path: Path, map_location: str | torch.device = "cpu") -> Any:
    """``torch.load(weights_only=True)``; CheckpointError says why the file cannot be used."""
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path} holds objects that are not plain tensors/containers and was refused: {_why_refused(exc)}",
            hint="only load checkpoints you trust; trainscale never unpickles arbitrary objects",
        ) from None
    except (RuntimeError, EOFError, zipfile.BadZipFile, OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is unreadable (truncated or corrupt): {_first_line(exc)}", hint=AGAIN) from None
    return state


def read_verified(
    path: Path, entry: dict[str, Any], map_location: str | torch.device = "cpu", *, rank: int = 0, world_size: int = 1
) -> tuple[Any, integrity.Verified]:
    """:func:`read_torch_file` of a file whose manifest ``entry`` must match. The size is checked first;
    the pieces are hashed on other threads while torch loads the file (nothing loaded is used before
    they match), so verifying adds little to the load itself (``Verified.seconds``: the hashing's own
    time, spent beside the load). Ranks that all load the file hash ``rank::world_size`` of its pieces
    each (the caller makes them agree). CheckpointError names the file."""
    path = Path(path)
    error = integrity.check_size(path, entry)
    if error is not None:
        raise error
    with ThreadPoolExecutor(max_workers=1) as pool:
        checking = pool.submit(
            integrity.verify, path.parent, {path.name: entry}, [path.name], rank=rank, world_size=world_size
        )
        failure: CheckpointError | None = None
        try:
            state = read_torch_file(path, map_location)
        except CheckpointError as exc:
            state, failure = None, exc
        verified = checking.result()  # raises the more precise reason when the bytes changed
    if failure is not None:
        raise failure
    return state, verified


def open_file(
    path: Path, map_location: str | torch.device = "cpu", *, rank: int = 0, world_size: int = 1
) -> tuple[dict[str, Any], integrity.Verified]:
    """One complete, verified checkpoint file and what verifying it cost (this rank's share of its
    pieces, see :func:`read_verified`); CheckpointError says why it cannot be used."""
    path = Path(path)
    sidecar = layout.sidecar_path(path)
    if not sidecar.exists():
        raise CheckpointError(f"{path} has no manifest ({sidecar.name}): it was not completely written", hint=AGAIN)
    manifest = integrity.unseal(sidecar)
    entry = manifest[integrity.FILES].get(path.name)
    if entry is None or len(manifest[integrity.FILES]) != 1:
        raise CheckpointError(f"{sidecar} is not the manifest of {path.name}", hint=AGAIN)
    state, verified = read_verified(path, entry, map_location, rank=rank, world_size=world_size)
    if not isinstance(state, dict) or state.get(layout.RECORD, {}).get("complete") is not True:
        raise CheckpointError(
            f"{path} is not a complete trainscale checkpoint", hint="delete it or point --resume elsewhere"
        )
    return state, verified


def load_file(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """One complete, verified checkpoint file; CheckpointError says why it cannot be used."""
    return open_file(path, map_location)[0]


def save_file(
    directory: Path,
    step: int,
    state: dict[str, Any],
    record: dict[str, Any],
    *,
    before_rename: Callable[[], None] | None = None,
) -> Path:
    """Rank 0 only: ``state`` plus its record, atomically (temp file, fsync, the manifest, rename,
    fsync directory), hashed while torch.save writes it. ``before_rename``: called once the temporary
    file is written (a test hook's place). A full disk: CheckpointError, nothing left behind."""
    path = layout.file_path(directory, step)

    def seal(entry: dict[str, Any]) -> None:  # the manifest first: until the .pt is renamed, the pair does not verify
        if before_rename is not None:
            before_rename()
        atomic_write_text(layout.sidecar_path(path), integrity.seal({**record, integrity.FILES: {path.name: entry}}))

    try:
        atomic_torch_save({**state, layout.RECORD: record}, path, before_rename=seal)
    except (OSError, RuntimeError) as exc:  # torch.save's zip writer turns ENOSPC into a RuntimeError
        if disk.is_full(exc):
            raise disk.full_error(Path(directory), step, disk.state_bytes(state)) from exc
        raise
    return path
