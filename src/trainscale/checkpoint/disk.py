"""The checkpoint directory as a place to write: refused at the start of a run when nothing can be
written there, and a full disk during a save turned into an error that says how much was needed."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from trainscale.checkpoint.background import failed_ranks
from trainscale.errors import CheckpointError

FULL = (errno.ENOSPC, errno.EDQUOT)


def unusable(directory: Path) -> str | None:
    """Why no checkpoint can be written under ``directory`` (None when one can): its nearest existing
    part must be a directory in which this process can create a file. Nothing is left behind: a
    missing ``directory`` is not created (the first save does that), the probe file is removed."""
    directory = Path(directory).absolute()
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a directory"
    try:
        fd, probe = tempfile.mkstemp(prefix=".trainscale-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"no file can be created in {existing}: {exc.strerror or exc}"
    return None


def check_directory(directory: Path, runtime: Any, writes: bool) -> None:
    """Every rank: CheckpointError on every rank when a rank that ``writes`` cannot write under
    ``directory`` (one small all-reduce when there is a process group, so that all ranks agree)."""
    problem = unusable(directory) if writes else None
    failed = failed_ranks(runtime, problem is not None)
    if problem is not None:
        raise CheckpointError(
            f"--checkpoint-dir {directory} is unusable: {problem}",
            hint="point --checkpoint-dir at a directory you can write to (created if missing), "
            "or fix its permissions / remount it read-write",
        )
    if failed:
        raise CheckpointError(
            f"--checkpoint-dir {directory} is unusable on rank(s) "
            f"{', '.join(map(str, failed))}: nothing can be written there",
            hint="that rank's log says why; point --checkpoint-dir at a directory every rank that saves can write to",
        )


def state_bytes(state: Any) -> int:
    """The bytes of the tensors in ``state`` (what a save of it writes, give or take its index)."""
    return sum(t.numel() * t.element_size() for t in tree_leaves(state) if isinstance(t, torch.Tensor))


_ZIP_WRITER = ("inline_container.cc", "PytorchStreamWriter failed writing", "unexpected pos")
"""How torch.save's zip stream reports a write that failed (no errno: DCP's background writer, torch.save)."""


def is_full(exc: BaseException, directory: Path | None = None, needed: int | None = None) -> bool:
    """Whether ``exc`` (or what caused it) is a full disk or an exhausted quota; also torch's zip writer's
    bare failure when the disk under ``directory`` has less free space left than the save ``needed``."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in FULL:
            return True
        if directory is not None and any(marker in str(exc) for marker in _ZIP_WRITER):
            try:
                return shutil.disk_usage(directory).free < max(needed or 0, 2**20)
            except OSError:
                return False
        exc = exc.__cause__ or exc.__context__
    return False


def full_error(directory: Path, step: int, needed: int | None, needs: str = "it needs") -> CheckpointError:
    """The error for a save of ``step`` that found the disk under ``directory`` full; ``needed``: the
    bytes ``needs`` (what was being written: the checkpoint, this rank's shards)."""
    try:
        free = f"{_mib(shutil.disk_usage(directory).free)} are free"
    except OSError:
        free = "the free space is unknown"
    need = f"{needs} about {_mib(needed)}, " if needed else ""
    return CheckpointError(
        f"the disk holding {directory} is full: saving the checkpoint of step {step} failed ({need}{free})",
        hint=f"free space there, keep fewer checkpoints, or point --checkpoint-dir at a larger file system; the "
        f"newest complete checkpoint in {directory} stays the one to resume from and nothing half-written "
        "was left",
    )


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**17 else f"{n} bytes"
