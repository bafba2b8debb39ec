"""trainscale's own storage for torch.distributed.checkpoint (DCP): a writer that hashes every file as
it writes it, and a reader that never unpickles anything but DCP's own metadata types, and reads nothing
the checkpoint's manifest does not list (:func:`check_storage`).

torch's ``FileSystemReader.read_metadata`` loads ``.metadata`` with plain ``pickle.load``: a crafted
file runs any code it names. :func:`read_metadata` unpickles it with an allow-list instead: exactly the
classes torch 2.x writes there (found by reading torch's metadata.py and filesystem.py and by
saving real fsdp checkpoints of Adam, AdamW(amsgrad), SGD(momentum), Adagrad and RMSprop states on
1 and 2 ranks, tests/unit/test_checkpoint_trust.py) and the plain values they hold. Anything else
is refused with CheckpointError before it is created. Shards hold tensors (read by DCP with
``weights_only=True``) and, for non-tensor entries, bytes that :class:`SafeLoadPlanner` loads with
``weights_only=True`` first.
"""

from __future__ import annotations

import io
import json
import pathlib
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader, FileSystemWriter, metadata
from torch.distributed.checkpoint.filesystem import FileSystem, _StorageInfo
from torch.distributed.checkpoint.metadata import BytesStorageMetadata, Metadata, StorageMeta

from trainscale.checkpoint import layout
from trainscale.checkpoint.atomic import atomic_write_text
from trainscale.checkpoint.integrity import HashingStream
from trainscale.errors import CheckpointError

REFUSE = "only load checkpoints you trust; trainscale never unpickles arbitrary objects"


def _allowed() -> dict[tuple[str, str], Any]:
    """(module, name) -> object: what a DCP ``.metadata`` may name, and nothing else."""
    allowed: dict[tuple[str, str], Any] = {
        (metadata.__name__, name): getattr(metadata, name)
        for name in (
            "Metadata",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "TensorProperties",
            "MetadataIndex",
            "StorageMeta",
            "_MEM_FORMAT_ENCODING",
        )  # TensorProperties pickles its memory format as this enum
    }
    allowed[(_StorageInfo.__module__, "_StorageInfo")] = _StorageInfo  # where each item lies in a shard
    allowed[("torch", "Size")] = torch.Size
    allowed[("torch.serialization", "_get_layout")] = torch.serialization._get_layout  # a name -> layout lookup
    for module in ("pathlib", "pathlib._local"):  # StorageMeta.checkpoint_id (3.13 moved the class)
        allowed[(module, "PosixPath")] = pathlib.PosixPath
    allowed.update({("torch", name): value for name, value in vars(torch).items() if isinstance(value, torch.dtype)})
    return allowed


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, path: Path) -> None:
        super().__init__(file)
        self.path = path
        self.allowed = _allowed()

    def find_class(self, module: str, name: str) -> Any:
        found = self.allowed.get((module, name))
        if found is None:
            raise CheckpointError(
                f"{self.path} names {module}.{name}, which is not one of DCP's metadata types, "
                "and was refused (a checkpoint's index must hold data, not code)",
                hint=REFUSE,
            )
        return found


def read_metadata(path: Path) -> Any:
    """DCP's ``Metadata`` from the file ``path``, unpickled with the allow-list; CheckpointError when it
    names anything else or is unreadable."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            metadata = _MetadataUnpickler(fh, path).load()
    except CheckpointError:
        raise
    except (
        pickle.UnpicklingError,
        EOFError,
        OSError,
        ValueError,
        TypeError,
        KeyError,
        AttributeError,
        IndexError,
    ) as exc:
        raise CheckpointError(
            f"{path} is unreadable (truncated or corrupt): {type(exc).__name__}",
            hint="nothing to do: the previous checkpoint is used",
        ) from None
    if not isinstance(metadata, Metadata):
        raise CheckpointError(
            f"{path} holds a {type(metadata).__name__}, not DCP's Metadata, and was refused", hint=REFUSE
        )
    return metadata


def check_storage(path: Path, metadata: Any, files: dict[str, Any]) -> None:
    """Every item DCP's index places in a shard — tensors and non-tensor entries alike — lies inside a file of
    the checkpoint's manifest: a bare name the manifest lists (not an absolute path or one that climbs out,
    which a crafted index could point at any file of the host) and bytes ``offset`` to ``offset + length``
    within that file's size. Checked before anything is read: a crafted length (2^40 bytes of /dev/zero) would
    otherwise be allocated on every rank."""
    for index, where in (metadata.storage_data or {}).items():
        name = str(getattr(where, "relative_path", ""))
        entry = files.get(name)
        if entry is None or Path(name).is_absolute() or ".." in Path(name).parts or "/" in name:
            raise CheckpointError(
                f"{path / layout.DCP_INDEX} places {getattr(index, 'fqn', index)} in {name!r}, which "
                "is not a file of this checkpoint's manifest, and was refused",
                hint=REFUSE,
            )
        offset, length = getattr(where, "offset", None), getattr(where, "length", None)
        if not (
            isinstance(offset, int)
            and isinstance(length, int)
            and 0 <= offset
            and 0 <= length <= entry["size"] - offset
        ):
            raise CheckpointError(
                f"{path / layout.DCP_INDEX} places {getattr(index, 'fqn', index)} at bytes "
                f"{offset}+{length} of {name}, which holds {entry['size']} bytes, and was refused",
                hint=REFUSE,
            )


def check_byte_entries(path: Path, metadata: Any, rank: int = 0, world_size: int = 1) -> None:
    """Load this rank's share (``rank::world_size`` in name order) of the checkpoint's non-tensor
    entries with ``weights_only=True``, so that a refused one is found while the checkpoint is being
    chosen (and skipped), not halfway through DCP's load. They are small: optimizer hyper-parameters."""
    wanted = {fqn for fqn, kind in metadata.state_dict_metadata.items() if isinstance(kind, BytesStorageMetadata)}
    entries = sorted(
        ((index, where) for index, where in (metadata.storage_data or {}).items() if index.fqn in wanted),
        key=lambda item: (item[0].fqn, item[1].relative_path, item[1].offset),
    )
    for index, where in entries[rank::world_size]:
        if where.transform_descriptors:
            raise CheckpointError(
                f"{path / where.relative_path} stores {index.fqn} through stream transforms "
                f"{list(where.transform_descriptors)}, which trainscale does not write",
                hint=REFUSE,
            )
        with open(path / where.relative_path, "rb") as fh:
            fh.seek(where.offset)
            data = io.BytesIO(fh.read(where.length))
        try:
            torch.load(data, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise CheckpointError(
                f"{path / where.relative_path} holds the entry {index.fqn}, whose objects are not "
                "plain tensors/containers, and was refused",
                hint=REFUSE,
            ) from exc
        except (RuntimeError, EOFError, ValueError, OSError) as exc:
            raise CheckpointError(
                f"{path / where.relative_path}: the entry {index.fqn} is unreadable ({type(exc).__name__})",
                hint="nothing to do: the previous checkpoint is used",
            ) from None


class UnreadableShards(CheckpointError):
    """A checkpoint's shards whose bytes verified against the manifest but do not load (a tensor's bytes
    somewhere else than its index says): the checkpoint is skipped like a damaged one. A checkpoint that
    loads but does not fit this model stays a refusal."""


class SafeReader(FileSystemReader):
    """torch's reader, but ``.metadata`` goes through :func:`read_metadata`. It takes no ``rank``
    argument, so DCP never falls back to rank-local metadata files either. Reading the shards' bytes
    fails as :class:`UnreadableShards`."""

    def read_data(self, plan: Any, planner: Any) -> Any:  # type: ignore[override]
        try:
            return super().read_data(plan, planner)
        except CheckpointError:
            raise
        except Exception as exc:
            raise UnreadableShards(
                f"{self.path}: its shards' bytes do not load ({type(exc).__name__})",
                hint="nothing to do: the previous checkpoint is used",
            ) from exc

    def read_metadata(self) -> Any:  # type: ignore[override]

        metadata = read_metadata(Path(self.path) / layout.DCP_INDEX)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeLoadPlanner(DefaultLoadPlanner):
    """DCP unpickles non-tensor entries (optimizer hyper-parameters) with weights_only=False.
    Each one must first load with weights_only=True, so a checkpoint's entries cannot run code."""

    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        try:
            torch.load(value, weights_only=True)  # raises on anything but tensors and plain containers
        except pickle.UnpicklingError as exc:
            raise CheckpointError(
                f"the entry {read_item.dest_index.fqn} holds objects that are not plain "
                "tensors/containers and was refused",
                hint=REFUSE,
            ) from exc
        value.seek(0)
        super().load_bytes(read_item, value)


class _HashingFileSystem(FileSystem):
    """torch's file system for DCP, with every file it writes hashed on the way (by name)."""

    def __init__(self) -> None:
        super().__init__()
        self.entries: dict[str, dict[str, Any]] = {}

    @contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[io.IOBase]:
        with super().create_stream(path, mode) as raw:
            if "w" not in mode:
                yield raw
                return
            stream = HashingStream(raw)
            yield stream  # type: ignore[misc]
            self.entries[Path(path).name] = stream.entry()

    def rename(self, path: Any, new_path: Any) -> None:  # .metadata is written as a temporary first
        super().rename(path, new_path)
        if Path(path).name in self.entries:
            self.entries[Path(new_path).name] = self.entries.pop(Path(path).name)

    def rm_file(self, path: Any) -> None:
        super().rm_file(path)
        self.entries.pop(Path(path).name, None)


class HashingWriter(FileSystemWriter):
    """torch's file-system writer (one shard file per rank, fsync'd), hashing what it writes. Each rank
    leaves its shards' sizes and hashes in ``layout.RANK_FILES`` of the partial directory once they are
    written (before DCP's last gather, so they are all on disk when the coordinator finishes); the
    coordinator's ``.metadata`` entry stays in :attr:`entries`.

    It copies nothing ahead (``per_thread_copy_ahead=0``): with any copy-ahead torch picks its overlapping
    loader wherever CUDA is available, which syncs ``torch.cuda.current_stream()`` from the writing thread;
    a background save writes from a fresh thread, whose device is GPU 0, so every rank of a node opened a
    CUDA context there. A background save's state is in host memory already; a synchronous one copies each
    GPU tensor in the calling thread, on the rank's own device."""

    def __init__(self, path: Path, rank: int) -> None:
        super().__init__(path, per_thread_copy_ahead=0)
        self.fs = _HashingFileSystem()
        self.owner_rank = rank

    @property
    def entries(self) -> dict[str, dict[str, Any]]:
        return self.fs.entries

    def write_data(self, plan: Any, planner: Any) -> Any:
        future = super().write_data(plan, planner)
        future.wait()  # torch's file-system writer has written (and fsync'd) its files when it returns
        shards = {name: entry for name, entry in self.fs.entries.items() if name != layout.DCP_INDEX}
        atomic_write_text(Path(self.path) / layout.RANK_FILES.format(rank=self.owner_rank), json.dumps(shards))
        return future


def rank_entries(partial: Path, world_size: int) -> dict[str, dict[str, Any]]:
    """Rank 0, once every rank's shards are on disk: their sizes and hashes, the per-rank files removed."""
    merged: dict[str, dict[str, Any]] = {}
    for rank in range(world_size):
        part = Path(partial) / layout.RANK_FILES.format(rank=rank)
        try:
            merged.update(json.loads(part.read_text()))
        except FileNotFoundError:
            raise CheckpointError(
                f"rank {rank} left no record of its shards in {partial}",
                hint="the save failed on that rank; its log says why",
            ) from None
        part.unlink()
    return merged
