"""Sharded checkpoints: every rank writes its own shards (``torch.distributed.checkpoint``), any
world size reads them back (DCP reshards on load); or a strategy writes its own native files.

A save goes to ``.ckpt-<step>.partial/`` and is renamed to ``ckpt-<step>/`` by rank 0 after every rank
has finished and the marker is on disk, so an interrupted save never looks like a complete one: the
partial name is never listed, and a directory whose marker is missing, or whose files do not match
the manifest in it (integrity.py), is skipped with a warning. Every rank hashes the files it writes
as it writes them (dcp_io.HashingWriter); rank 0 collects the hashes into the marker. Sharded
checkpoints need a directory every rank can see (a shared file system on multi-node runs). The
names are in layout.py.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from trainscale.checkpoint import disk, integrity, layout
from trainscale.checkpoint.atomic import atomic_torch_save, atomic_write_text, fsync_dir
from trainscale.checkpoint.dcp_io import (
    HashingWriter,
    SafeLoadPlanner,
    SafeReader,
    UnreadableShards,
    check_byte_entries,
    check_storage,
    rank_entries,
    read_metadata,
)
from trainscale.checkpoint.files import read_verified
from trainscale.checkpoint.integrity import AGAIN
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
            raise CheckpointError(
                f"{self.path} is a {self.format!r} checkpoint, not a DCP one",
                hint=f"resume it with --strategy {self.format}",
            )

        wanted = {k: template[k] for k in layout.SHARDED_KEYS if k in template}
        try:
            dcp.load(
                wanted, storage_reader=SafeReader(self.path), planner=SafeLoadPlanner(), no_dist=not _distributed()
            )
        except (Exception, CheckpointException) as exc:  # the latter is a BaseException
            causes = [
                exc,
                *(f[0] for f in (getattr(exc, "failures", None) or {}).values() if isinstance(f, tuple) and f),
            ]
            if any(isinstance(cause, UnreadableShards) for cause in causes):  # bytes, not this model: skip it
                raise UnreadableShards(
                    f"{self.path}: its shards' bytes do not load", hint="nothing to do: the previous checkpoint is used"
                ) from exc
            raise CheckpointError(
                f"{self.path} could not be read into this model/optimizer: {_describe(exc)}",
                hint="was it written for another model or optimizer? Start a new checkpoint "
                "directory, or resume with the code that wrote it",
            ) from exc
        return wanted


def _describe(exc: BaseException) -> str:
    """One line per failing rank for DCP's CheckpointException, else the exception's own message."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict) and failures:
        return "; ".join(f"rank {rank}: {type(err[0]).__name__}: {err[0]}" for rank, err in sorted(failures.items()))
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[-1] if text else ''}"


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized()


def save(
    directory: Path,
    step: int,
    state: dict[str, Any],
    runtime: Any,
    record: dict[str, Any],
    write_native: Callable[[Path], None] | None = None,
) -> Path:
    """Every rank calls this. The SHARDED_KEYS of ``state`` go to DCP shards (or, with ``write_native``,
    the strategy writes its own files), rank 0 adds the rest as EXTRA and the marker, and renames the
    partial directory into place; returns the final path on every rank."""
    final, partial = _begin(Path(directory), step, runtime)
    shards = {k: state[k] for k in layout.SHARDED_KEYS if k in state}
    writer = None
    if shards:
        writer = HashingWriter(partial, runtime.rank)
        try:  # a collective; rank 0 writes .metadata last, after every rank's shards
            dcp.save(shards, storage_writer=writer, no_dist=not _distributed())
        except CheckpointException as exc:  # a BaseException: turn it into an error a user can act on
            failed = _failed(step, directory, exc, disk.state_bytes(shards))
            if runtime.is_main:  # DCP reports on every rank once every rank has stopped writing
                shutil.rmtree(partial, ignore_errors=True)
            raise failed from exc
    if write_native is not None:
        write_native(partial)
    runtime.barrier()  # every rank's shards are on disk
    if runtime.is_main:
        _complete(partial, final, _rest(state), record, writer, step)
    runtime.barrier()  # nobody runs ahead (or exits) before the checkpoint is complete
    return final


def save_async(
    directory: Path,
    step: int,
    state: dict[str, Any],
    runtime: Any,
    record: dict[str, Any],
    *,
    stager: Any,
    group: Any,
    before_rename: Callable[[], None] | None = None,
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
    upload, writer, needed = None, None, disk.state_bytes(shards)
    if shards:
        writer = HashingWriter(partial, runtime.rank)
        response = dcp.async_save(
            shards, storage_writer=writer, process_group=group, async_stager=stager, no_dist=not _distributed()
        )
        upload = getattr(response, "upload_completion", response)  # a Future, or torch's newer response

    def finish() -> None:
        if upload is not None:
            try:
                upload.result()
            except (Exception, CheckpointException) as exc:  # the latter is a BaseException
                failed = _failed(step, directory, exc, needed)
                if runtime.is_main:
                    shutil.rmtree(partial, ignore_errors=True)
                raise failed from exc
        if runtime.is_main:
            if before_rename is not None:
                before_rename()
            _complete(partial, final, rest, record, writer, step)

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


def _failed(step: int, directory: Path, exc: BaseException, needed: int) -> CheckpointError:
    """The error for a failed save of ``step`` (before its partial directory is removed: a full disk is still
    full then); a full disk named as one on the rank(s) it filled up for."""
    failures = getattr(exc, "failures", None) or {0: (exc, None)}
    full_on = sorted(rank for rank, err in failures.items() if disk.is_full(err[0], Path(directory), needed))
    if full_on:
        full = disk.full_error(Path(directory), step, needed, needs="this rank's shards need")
        return CheckpointError(f"{full.message} on rank(s) {', '.join(map(str, full_on))}", hint=full.hint)
    return CheckpointError(
        f"saving the sharded checkpoint of step {step} failed: {_describe(exc)}",
        hint=f"the newest complete checkpoint in {directory} stays the one to resume from; "
        "check free space and permissions",
    )


def _complete(partial: Path, final: Path, rest: dict[str, Any], record: dict[str, Any], writer: Any, step: int) -> None:
    """Rank 0, once every rank's part is on disk: EXTRA, the marker with the manifest of every file,
    private modes, then the rename that makes the checkpoint visible. A full disk: CheckpointError,
    the partial directory removed."""
    try:
        _seal(partial, rest, record, writer)
    except (OSError, RuntimeError) as exc:  # torch.save's zip writer turns ENOSPC into a RuntimeError
        full = disk.is_full(exc, final.parent, disk.state_bytes(rest))  # before the partial directory goes
        shutil.rmtree(partial, ignore_errors=True)
        if full:
            raise disk.full_error(final.parent, step, disk.state_bytes(rest)) from exc
        raise
    if final.is_symlink():  # not one of ours (find_latest skipped it): the link goes, never its target
        final.unlink()
    elif final.exists():  # the same step saved again (a resumed run)
        shutil.rmtree(final)
    os.replace(partial, final)
    fsync_dir(final.parent)


def _seal(partial: Path, rest: dict[str, Any], record: dict[str, Any], writer: Any) -> None:
    files: dict[str, Any] = {}
    if writer is not None:
        files.update(rank_entries(partial, int(record["world_size"])))
        files[layout.DCP_INDEX] = writer.entries[layout.DCP_INDEX]
    files[layout.EXTRA] = atomic_torch_save(rest, partial / layout.EXTRA)
    for path in sorted(p for p in partial.rglob("*") if p.is_file()):
        name = path.relative_to(partial).as_posix()
        if name not in files:  # a strategy's native files: its own code wrote them, read them once
            files[name] = integrity.hash_file(path)
        os.chmod(path, 0o600)
    marker = {
        **record,
        "format": "dcp" if writer is not None else record.get("strategy", "native"),
        "sharded_format": layout.FORMAT,
        integrity.FILES: files,
    }
    atomic_write_text(partial / layout.MARKER, integrity.seal(marker))
    fsync_dir(partial)


def read_marker(path: Path) -> dict[str, Any]:
    """The marker and manifest of a complete sharded checkpoint whose files are all there, with their
    sizes, and nothing else (cheap: no file is read); CheckpointError says why ``path`` is not one."""
    marker_file = Path(path) / layout.MARKER
    if not marker_file.exists():
        raise CheckpointError(
            f"{path} has no {layout.MARKER}: the save was interrupted before it completed", hint=AGAIN
        )
    marker = integrity.unseal(marker_file)
    if marker.get("complete") is not True:
        raise CheckpointError(f"{marker_file} does not mark a complete checkpoint", hint="delete the directory")
    if marker.get("format") == "dcp" and layout.DCP_INDEX not in marker[integrity.FILES]:
        raise CheckpointError(
            f"{marker_file} lists no DCP {layout.DCP_INDEX} index: its shards are incomplete", hint=AGAIN
        )
    integrity.check_listing(Path(path), marker[integrity.FILES], own=[layout.MARKER])
    return marker


def open_checkpoint(
    path: Path, rank: int = 0, world_size: int = 1
) -> tuple[dict[str, Any], ShardedRef, integrity.Verified]:
    """A complete, verified sharded checkpoint: (its EXTRA entries with the record, its shards left on
    disk, what verifying cost here). Every file is checked against the manifest: the shards' pieces
    split among ``world_size`` ranks (each calls this with its ``rank``; the caller makes them agree),
    the files every rank reads (EXTRA, DCP's index) by each of them. DCP's index is then unpickled with
    the allow-list and this rank's share of the non-tensor entries loaded with weights_only
    (dcp_io.py), so that a refused one is skipped like a corrupt one."""
    path = Path(path)
    marker = read_marker(path)
    files = marker[integrity.FILES]
    read_by_all = (layout.EXTRA, layout.DCP_INDEX)
    shards = [name for name in files if name not in read_by_all]
    verified = integrity.verify(path, files, shards, rank=rank, world_size=world_size)
    if layout.EXTRA not in files:
        raise CheckpointError(f"{path / layout.MARKER} lists no {layout.EXTRA}", hint=AGAIN)
    extra, cost = read_verified(path / layout.EXTRA, files[layout.EXTRA])
    verified.add(cost)
    if marker["format"] == "dcp":
        verified.add(integrity.verify(path, files, [layout.DCP_INDEX]))
        # Refused here, before the ranks choose this checkpoint, rather than halfway through DCP's load.
        metadata = read_metadata(path / layout.DCP_INDEX)
        check_storage(path, metadata, files)
        check_byte_entries(path, metadata, rank, world_size)
    record = {k: marker[k] for k in layout.RECORD_FIELDS if k in marker}
    return {**extra, layout.RECORD: record}, ShardedRef(path, marker["format"]), verified
