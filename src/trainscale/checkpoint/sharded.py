"""Sharded checkpoints: every rank writes its own shards (``torch.distributed.checkpoint``), any
world size reads them back (DCP reshards on load); or a strategy writes its own native files.

A save goes to ``.ckpt-<step>.partial/`` and is renamed to ``ckpt-<step>/`` by rank 0 after every rank
has finished and the marker is on disk, so an interrupted save never looks like a complete one: the
partial name is never listed, and a directory without its marker (or without DCP's index) is
skipped with a warning. Sharded checkpoints need a directory every rank can see (a shared file
system on multi-node runs). The names are in layout.py.
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

from trainscale.checkpoint import layout
from trainscale.checkpoint.atomic import atomic_torch_save, atomic_write_text, fsync_dir
from trainscale.checkpoint.files import read_torch_file
from trainscale.errors import CheckpointError


@dataclass(frozen=True)
class ShardedRef:
    """The model/optimizer part of a sharded checkpoint, still on disk, so that each rank reads only
    the shards it needs, into its own layout."""

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

        wanted = {k: template[k] for k in layout.SHARDED_KEYS if k in template}
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


def save(directory: Path, step: int, state: dict[str, Any], runtime: Any, record: dict[str, Any],
         write_native: Callable[[Path], None] | None = None) -> Path:
    """Every rank calls this. The SHARDED_KEYS of ``state`` go to DCP shards (or, with ``write_native``,
    the strategy writes its own files), rank 0 adds the rest as EXTRA and the marker, and renames the
    partial directory into place; returns the final path on every rank."""
    final, partial = _begin(Path(directory), step, runtime)
    shards = {k: state[k] for k in layout.SHARDED_KEYS if k in state}
    if shards:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        try:  # a collective; rank 0 writes .metadata last, after every rank's shards
            dcp.save(shards, checkpoint_id=str(partial), no_dist=not _distributed())
        except CheckpointException as exc:  # a BaseException: turn it into an error a user can act on
            raise _failed(step, directory, exc) from exc
    if write_native is not None:
        write_native(partial)
    runtime.barrier()  # every rank's shards are on disk
    if runtime.is_main:
        _complete(partial, final, _rest(state), record, bool(shards))
    runtime.barrier()  # nobody runs ahead (or exits) before the checkpoint is complete
    return final


def save_async(directory: Path, step: int, state: dict[str, Any], runtime: Any, record: dict[str, Any], *,
               stager: Any, group: Any, before_rename: Callable[[], None] | None = None
               ) -> tuple[Path, Callable[[], None]]:
    """Every rank calls this; the state is staged when it returns. DCP's ``async_save`` copies this
    rank's shards into ``stager``'s host memory and writes them in torch's background thread, planning
    over ``group`` (not the training's process group); rank 0 stages the rest. Returns the final path
    and the job that finishes the save, to run in the background on every rank: it waits for DCP
    (whose last gather means every rank's shards and .metadata are on disk), then rank 0 writes
    EXTRA and the marker and renames the partial directory into place, as :func:`save` does."""
    final, partial = _begin(Path(directory), step, runtime)
    shards = {k: state[k] for k in layout.SHARDED_KEYS if k in state}
    rest = stager.stage(_rest(state)) if runtime.is_main else None
    upload = None
    if shards:
        import torch.distributed.checkpoint as dcp

        response = dcp.async_save(shards, checkpoint_id=str(partial), process_group=group, async_stager=stager,
                                  no_dist=not _distributed())
        upload = getattr(response, "upload_completion", response)  # a Future, or torch's newer response

    def finish() -> None:
        if upload is not None:
            from torch.distributed.checkpoint.api import CheckpointException

            try:
                upload.result()
            except CheckpointException as exc:
                raise _failed(step, directory, exc) from exc
        if runtime.is_main:
            if before_rename is not None:
                before_rename()
            _complete(partial, final, rest, record, bool(shards))

    return final, finish


def _begin(directory: Path, step: int, runtime: Any) -> tuple[Path, Path]:
    """Every rank: (final path, partial directory), the latter created empty and private by rank 0."""
    final, partial = layout.directory_path(directory, step), layout.partial_path(directory, step)
    runtime.barrier()  # everybody has finished the step being saved
    if runtime.is_main:
        shutil.rmtree(partial, ignore_errors=True)  # left by an interrupted save of this step
        directory.mkdir(parents=True, exist_ok=True)
        # Private from the first byte: nobody else can enter the directory, whatever the shard
        # files' own modes (DCP creates them with the umask's defaults).
        partial.mkdir(mode=0o700)
        os.chmod(partial, 0o700)
    runtime.barrier()
    return final, partial


def _rest(state: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in state.items() if k not in layout.SHARDED_KEYS}


def _failed(step: int, directory: Path, exc: BaseException) -> CheckpointError:
    return CheckpointError(f"saving the sharded checkpoint of step {step} failed: {_describe(exc)}",
                           hint=f"the newest complete checkpoint in {directory} stays the one to resume from; "
                                "check free space and permissions")


def _complete(partial: Path, final: Path, rest: dict[str, Any], record: dict[str, Any], shards: bool) -> None:
    """Rank 0, once every rank's part is on disk: EXTRA, the marker, private modes, then the rename
    that makes the checkpoint visible."""
    atomic_torch_save(rest, partial / layout.EXTRA)
    marker = {**record, "format": "dcp" if shards else record.get("strategy", "native"),
              "sharded_format": layout.FORMAT}
    atomic_write_text(partial / layout.MARKER, json.dumps(marker, indent=2))
    for shard in partial.iterdir():
        os.chmod(shard, 0o600)
    fsync_dir(partial)
    if final.exists():  # the same step saved again (a resumed run)
        shutil.rmtree(final)
    os.replace(partial, final)
    fsync_dir(final.parent)


def read_marker(path: Path) -> dict[str, Any]:
    """The marker of a complete sharded checkpoint; CheckpointError says why ``path`` is not one."""
    marker_file = Path(path) / layout.MARKER
    try:
        marker = json.loads(marker_file.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path} has no {layout.MARKER}: the save was interrupted before it completed",
                              hint="delete it; the previous checkpoint will be used") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{marker_file} is unreadable: {exc}", hint="delete the directory") from None
    if not isinstance(marker, dict) or marker.get("complete") is not True:
        raise CheckpointError(f"{marker_file} does not mark a complete checkpoint", hint="delete the directory")
    if marker.get("format") == "dcp" and not (Path(path) / layout.DCP_INDEX).is_file():
        raise CheckpointError(f"{path} lacks DCP's {layout.DCP_INDEX} index: its shards are incomplete",
                              hint="delete it; the previous checkpoint will be used")
    return marker


def open_checkpoint(path: Path) -> tuple[dict[str, Any], ShardedRef]:
    """A complete sharded checkpoint: (its EXTRA entries with the record, its shards left on disk)."""
    marker = read_marker(path)
    extra = read_torch_file(Path(path) / layout.EXTRA)
    record = {k: marker[k] for k in layout.RECORD_FIELDS if k in marker}
    return {**extra, layout.RECORD: record}, ShardedRef(Path(path), marker["format"])
