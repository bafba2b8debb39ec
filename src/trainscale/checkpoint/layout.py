"""The on-disk contract of trainscale checkpoints, in one place (a leaf: it imports nothing of trainscale).

One directory holds the checkpoints of one run, newest step wins::

    ckpt-00000040.pt          a rank-0 file (ddp, zero1): one torch.save'd dict, its "trainscale"
                              entry records FORMAT, version, world size, strategy, step, complete=True
    ckpt-00000040.pt.json     its manifest: the same record, the .pt's size and SHA-256, a digest
    ckpt-00000080/            a sharded checkpoint (fsdp, deepspeed), written by every rank:
        .metadata, *.distcp   DCP's index and shards of "model" and "optimizer" (format "dcp"),
                              or a strategy's native files (format = the strategy's name)
        extra.pt              everything else: step, RNG, scheduler, ... (rank 0)
        trainscale.json       the completion marker and manifest, written last: the record above,
                              every other file's size and SHA-256, a digest
    .ckpt-00000120.partial/   a sharded save in progress (renamed into place when complete)
        .files-00003.json     while it is in progress: the sizes and hashes of rank 3's shards
    .ckpt-00000120.pt.*.tmp   a rank-0 file being written (atomic.py renames it into place)

A checkpoint is *verified* when every file its manifest lists is there with that size and SHA-256,
nothing else is, and the manifest matches its own digest (integrity.py); only a verified checkpoint
is resumed from. A sharded checkpoint's manifest is written inside the partial directory before the
one rename that makes it visible, so it is part of the same atomic commit. A rank-0 file keeps its
manifest beside it (a sidecar), so its name, its single rename and ``torch.load(path)`` stay as they
were: the sidecar is renamed into place *before* the .pt, so at every instant either the .pt is
absent, or the sidecar describes bytes that are not (yet) the .pt's and the pair does not verify,
or both are complete. A .pt without a valid sidecar entry is never taken as verified.

Names carry at least eight digits (``ckpt-{step:08d}``); partial and temporary names are never listed.
Only this FORMAT (2: manifests) loads; nothing written with FORMAT 1 was released.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

FORMAT = 2
"""Version of the layout and of the record below; raise it when either changes incompatibly."""
MARKER = "trainscale.json"
"""A sharded checkpoint's completion marker and manifest (JSON), written after every other file."""
SIDECAR = ".json"
"""Appended to a rank-0 file's name: its manifest (``ckpt-00000040.pt.json``)."""
RANK_FILES = ".files-{rank:05d}.json"
"""Inside a partial directory: one rank's shard sizes and hashes, merged into MARKER by rank 0."""
EXTRA = "extra.pt"
"""A sharded checkpoint's rank-0 file of everything that is not model/optimizer shards."""
DCP_INDEX = ".metadata"
"""torch.distributed.checkpoint's index, written by rank 0 after every rank's shards."""
RECORD = "trainscale"
"""The entry of a rank-0 file (and the fields of MARKER) that says what wrote it."""
SHARDED_KEYS = ("model", "optimizer")
"""Entries a DCP checkpoint stores as shards; the rest of the state goes to EXTRA."""
RECORD_FIELDS = ("format", "version", "world_size", "strategy", "step", "complete")

_FILE = re.compile(r"^ckpt-(\d{8,})\.pt$")
_DIRECTORY = re.compile(r"^ckpt-(\d{8,})$")


def file_path(directory: Path, step: int) -> Path:
    return Path(directory) / f"ckpt-{step:08d}.pt"


def sidecar_path(file: Path) -> Path:
    """The manifest of the rank-0 file ``file``."""
    return Path(file).with_name(Path(file).name + SIDECAR)


def directory_path(directory: Path, step: int) -> Path:
    return Path(directory) / f"ckpt-{step:08d}"


def partial_path(directory: Path, step: int) -> Path:
    return Path(directory) / f".ckpt-{step:08d}.partial"


def list_checkpoints(directory: Path) -> list[tuple[int, Path]]:
    """(step, path) for every checkpoint file and sharded checkpoint directory, newest first."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [
        (int(m.group(1)), p)
        for p in directory.iterdir()
        if (m := _FILE.match(p.name)) or (p.is_dir() and (m := _DIRECTORY.match(p.name)))
    ]
    return sorted(found, reverse=True)


def leftovers(directory: Path) -> Iterator[Path]:
    """What interrupted saves left behind: partial directories and temporary files, never complete."""
    yield from Path(directory).glob(".ckpt-*.partial")
    yield from Path(directory).glob(".ckpt-*.tmp")
    # A sidecar renamed into place by a save killed before its .pt was.
    yield from (p for p in Path(directory).glob("ckpt-*.pt" + SIDECAR) if not p.with_suffix("").exists())


def record(
    *, version: str, world_size: int, strategy: str, step: int, format: Any = FORMAT, **about: Any
) -> dict[str, Any]:
    """What a checkpoint says about itself (``about``: what its writer adds, e.g. the loop's global batch);
    ``complete`` is the last thing a save writes."""
    return {
        "format": format,
        "version": version,
        "world_size": world_size,
        "strategy": strategy,
        "step": step,
        **about,
        "complete": True,
    }


def manifest_path(path: Path) -> Path:
    """Where the checkpoint at ``path`` (a rank-0 file or a sharded directory) keeps its JSON manifest."""
    path = Path(path)
    return path / MARKER if path.is_dir() else sidecar_path(path)


def newest_record(directory: Path) -> dict[str, Any] | None:
    """What the newest checkpoint in ``directory`` says about itself, read from its JSON manifest without
    verifying anything (a hint for shaping a run before it resumes; the resume verifies and decides). None
    where there is none or it cannot be read."""
    for _, path in list_checkpoints(directory)[:1]:
        try:
            said = json.loads(manifest_path(path).read_text())
        except (OSError, ValueError):
            return None
        return said if isinstance(said, dict) else None
    return None


RUN_NOTE = "checkpoints.json"
"""In a run's directory (TRAINSCALE_RUN_DIR): ``{"directory": ...}``, where the run's ranks save, so
the launcher can name the checkpoint a restarted group resumes from without asking the ranks."""


def note_directory(run_dir: str | Path, directory: Path) -> None:
    """Rank 0: say where this run saves (atomically; a run directory that cannot be written is no error)."""
    note = Path(run_dir) / RUN_NOTE
    tmp = note.with_name(f".{RUN_NOTE}.{os.getpid()}.tmp")
    try:
        note.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps({"directory": str(Path(directory).absolute())}))
        os.replace(tmp, note)
    except OSError:
        tmp.unlink(missing_ok=True)


def noted_directory(run_dir: str | Path) -> Path | None:
    """The checkpoint directory the run's ranks noted, or None."""
    try:
        return Path(json.loads((Path(run_dir) / RUN_NOTE).read_text())["directory"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
