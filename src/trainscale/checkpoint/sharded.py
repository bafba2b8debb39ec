"""Sharded checkpoints: every rank writes its own shards (``torch.distributed.checkpoint``), any
world size reads them back (DCP reshards on load).

Layout, one directory per step next to the rank-0 ``ckpt-<step>.pt`` files::

    ckpt-00000040/            model + optimizer shards (*.distcp) and DCP's .metadata index,
                              or a strategy's native files (DeepSpeed)
        extra.pt              everything else in the state: step, RNG, scheduler, ... (rank 0)
        trainscale.json       completion marker: format, world size, strategy, step (written last)

A save goes to ``.ckpt-<step>.partial/`` and is renamed to ``ckpt-<step>/`` by rank 0 after every rank
has finished and the marker is on disk, so an interrupted save never looks like a complete one: the
partial name is never listed, and a directory without its marker (or without DCP's .metadata) is
skipped with a warning. Sharded checkpoints need a directory every rank can see (a shared file
system on multi-node runs).
"""

from __future__ import annotations

import io
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from trainscale._version import __version__
from trainscale.checkpoint.atomic import atomic_torch_save, atomic_write_text, fsync_dir
from trainscale.errors import CheckpointError

MARKER = "trainscale.json"
EXTRA = "extra.pt"
DCP_KEYS = ("model", "optimizer")  # state entries written as shards; the rest goes to extra.pt
WRITER_KEY = "sharded_writer"  # optional: callable(path) run on every rank (a strategy's own format)
FORMAT = 1


def sharded_path(directory: Path, step: int) -> Path:
    return Path(directory) / f"ckpt-{step:08d}"


def partial_path(directory: Path, step: int) -> Path:
    return Path(directory) / f".ckpt-{step:08d}.partial"


@dataclass(frozen=True)
class ShardedRef:
    """The model/optimizer part of a sharded checkpoint, still on disk. A sharded strategy reads it
    into its own layout (``load(template)``), so each rank reads only the shards it needs."""

    path: Path
    format: str
    """dcp (torch.distributed.checkpoint) or the name of a strategy's native format (deepspeed)."""

    def load(self, template: dict[str, Any]) -> dict[str, Any]:
        """Fill ``template`` (this run's own state dict: DTensors, plain tensors) in place from the
        shards and return it. A collective when a process group exists: every rank calls it."""
        if self.format != "dcp":
            raise CheckpointError(f"{self.path} is a {self.format!r} checkpoint, not a DCP one",
                                  hint=f"resume it with --strategy {self.format}")
        import torch.distributed.checkpoint as dcp

        from torch.distributed.checkpoint.api import CheckpointException

        wanted = {k: template[k] for k in DCP_KEYS if k in template}
        try:
            dcp.load(wanted, checkpoint_id=str(self.path), planner=_safe_load_planner(), no_dist=not _distributed())
        except (Exception, CheckpointException) as exc:  # the latter is a BaseException
            raise CheckpointError(f"{self.path} could not be read into this model/optimizer: {_describe(exc)}",
                                  hint="was it written for another model or optimizer? Start a new checkpoint "
                                       "directory, or resume with the code that wrote it") from exc
        return wanted


def _describe(exc: BaseException) -> str:
    """One line per failing rank for DCP's CheckpointException, else the exception's own message."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        return "; ".join(f"rank {rank}: {type(err[0]).__name__}: {err[0]}" for rank, err in sorted(failures.items()))
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[-1] if text else ''}"


def _safe_load_planner():
    from torch.distributed.checkpoint import DefaultLoadPlanner

    class SafeLoadPlanner(DefaultLoadPlanner):
        """DCP unpickles non-tensor entries (optimizer hyper-parameters) with weights_only=False.
        Each one must first load with weights_only=True, so a checkpoint's entries cannot run code."""

        def load_bytes(self, read_item, value: io.BytesIO) -> None:
            torch.load(value, weights_only=True)  # raises on anything but tensors and plain containers
            value.seek(0)
            super().load_bytes(read_item, value)

    return SafeLoadPlanner()


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()


def save(directory: Path, step: int, state: dict[str, Any], runtime: Any, meta: dict[str, Any]) -> Path:
    """Every rank calls this. Shards go to a partial directory, rank 0 adds extra.pt and the marker
    and renames it into place; returns the final path on every rank."""
    directory = Path(directory)
    final, partial = sharded_path(directory, step), partial_path(directory, step)
    runtime.barrier()  # everybody has finished the step being saved
    if runtime.is_main:
        shutil.rmtree(partial, ignore_errors=True)  # left by an interrupted save of this step
        directory.mkdir(parents=True, exist_ok=True)
        # Private from the first byte: nobody else can enter the directory, whatever the shard
        # files' own modes (DCP creates them with the umask's defaults).
        partial.mkdir(mode=0o700)
        os.chmod(partial, 0o700)
    runtime.barrier()
    shards = {k: state[k] for k in DCP_KEYS if k in state}
    writer: Callable[[Path], None] | None = state.get(WRITER_KEY)
    if shards:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        try:  # a collective; rank 0 writes .metadata last, after every rank's shards
            dcp.save(shards, checkpoint_id=str(partial), no_dist=not _distributed())
        except CheckpointException as exc:  # a BaseException: turn it into an error a user can act on
            raise CheckpointError(f"saving the sharded checkpoint of step {step} failed: {_describe(exc)}",
                                  hint=f"the newest complete checkpoint in {directory} stays the one to resume "
                                       "from; check free space and permissions") from exc
    if writer is not None:
        writer(partial)
    runtime.barrier()  # every rank's shards are on disk
    if runtime.is_main:
        extra = {k: v for k, v in state.items() if k not in DCP_KEYS and k != WRITER_KEY}
        atomic_torch_save(extra, partial / EXTRA)
        marker = {**meta, "format": "dcp" if shards else meta.get("strategy", "native"),
                  "sharded_format": FORMAT, "version": __version__, "step": step, "complete": True}
        atomic_write_text(partial / MARKER, json.dumps(marker, indent=2))
        for shard in partial.iterdir():
            os.chmod(shard, 0o600)
        fsync_dir(partial)
        if final.exists():  # the same step saved again (a resumed run)
            shutil.rmtree(final)
        os.replace(partial, final)
        fsync_dir(directory)
    runtime.barrier()  # nobody runs ahead (or exits) before the checkpoint is complete
    return final


def read_marker(path: Path) -> dict[str, Any]:
    """The marker of a complete sharded checkpoint; CheckpointError says why ``path`` is not one."""
    marker_file = Path(path) / MARKER
    try:
        marker = json.loads(marker_file.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path} has no {MARKER}: the save was interrupted before it completed",
                              hint="delete it; the previous checkpoint will be used") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{marker_file} is unreadable: {exc}", hint="delete the directory") from None
    if not isinstance(marker, dict) or marker.get("complete") is not True:
        raise CheckpointError(f"{marker_file} does not mark a complete checkpoint", hint="delete the directory")
    if marker.get("format") == "dcp" and not (Path(path) / ".metadata").is_file():
        raise CheckpointError(f"{path} lacks DCP's .metadata index: its shards are incomplete",
                              hint="delete it; the previous checkpoint will be used")
    return marker


def open_checkpoint(path: Path) -> dict[str, Any]:
    """The state of a complete sharded checkpoint as the rank-0 path gives it, with the shards left on
    disk under ``state["sharded"]`` (a ShardedRef) for the strategy to read."""
    from trainscale.checkpoint.manager import read_torch_file

    marker = read_marker(path)
    extra = read_torch_file(Path(path) / EXTRA)
    meta = {k: marker[k] for k in ("format", "version", "world_size", "strategy", "step", "complete") if k in marker}
    return {**extra, "trainscale": meta, "sharded": ShardedRef(Path(path), marker["format"])}

