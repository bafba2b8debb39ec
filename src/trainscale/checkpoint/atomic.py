"""Write a file so that a crash at any moment leaves either the old file or the complete new one."""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainscale.checkpoint.integrity import HashingStream

PRIVATE = 0o600  # training state is the user's alone


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(
    path: Path,
    write: Callable[[io.BufferedWriter], None],
    mode: int = PRIVATE,
    *,
    before_rename: Callable[[], None] | None = None,
) -> None:
    """Temp file in the same directory, write, flush + fsync, ``before_rename()``, ``os.replace``,
    fsync the directory. On any failure the temp file is removed and ``path`` is left as it was."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def atomic_torch_save(
    obj: Any, path: Path, *, before_rename: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """``torch.save(obj)`` to ``path`` atomically; returns the file's manifest entry (size, SHA-256),
    hashed as it was written, which ``before_rename(entry)`` is given too."""
    entry: dict[str, Any] = {}

    def write(fh: io.BufferedWriter) -> None:
        stream = HashingStream(fh)
        torch.save(obj, stream)
        entry.update(stream.entry())

    atomic_write(path, write, before_rename=None if before_rename is None else lambda: before_rename(entry))
    return entry


def atomic_write_text(path: Path, text: str) -> None:
    atomic_write(path, lambda fh: fh.write(text.encode()))
