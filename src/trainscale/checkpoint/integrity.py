"""What a checkpoint's manifest says and how it is checked: every file's size and SHA-256.

The hashes are taken *while* the bytes are written (:class:`HashingStream` sits between the writer
and the file: torch.save's stream, DCP's shard streams), so a save never reads its own files back.
Only files written by someone else's code (a strategy's native files: DeepSpeed opens its own) are
hashed by reading them once, before the checkpoint is made visible.

A manifest is JSON: the checkpoint's record, ``"files": {relative path: {"size", "sha256"}}`` and
``"digest"``, the SHA-256 of all the rest (canonical JSON), so that a flipped byte in the manifest
itself is caught too. It detects accidents (truncation, bit rot, a half-copied directory, a lost
shard); it authenticates nothing: whoever can write a checkpoint can rewrite its manifest
(docs/security.md: what keeps a crafted checkpoint from running code is the restricted unpickling).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from trainscale.errors import CheckpointError

FILES, DIGEST = "files", "digest"
_CHUNK = 8 << 20  # hashlib releases the GIL on large updates: big reads let hashing run beside loading


class HashingStream:
    """A write-only stream that forwards every byte to ``raw`` and hashes it on the way.

    Sequential writes only: seeking back would make the hash differ from the file, so it cannot
    (torch.save and DCP's shard writer never seek). Closing it flushes ``raw``; whoever opened
    ``raw`` closes it."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self._sha = hashlib.sha256()
        self.size = 0
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        written = self.raw.write(view)
        written = len(view) if written is None else written
        self._sha.update(view[:written])
        self.size += written
        return written

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def tell(self) -> int:
        return self.raw.tell()  # DCP records each item's offset in its shard file

    def fileno(self) -> int:
        return self.raw.fileno()  # DCP fsyncs its shard files

    def flush(self) -> None:
        self.raw.flush()

    def close(self) -> None:
        if not self.closed:
            self.raw.flush()
            self.closed = True

    def entry(self) -> dict[str, Any]:
        """This stream's manifest entry: the size and SHA-256 of everything written so far."""
        return {"size": self.size, "sha256": self._sha.hexdigest()}


def hash_file(path: Path) -> dict[str, Any]:
    """A file's manifest entry, by reading it (for files someone else's code wrote)."""
    sha, size = hashlib.sha256(), 0
    buffer = bytearray(_CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buffer):
            sha.update(view[:n])
            size += n
    return {"size": size, "sha256": sha.hexdigest()}


def _canonical(manifest: dict[str, Any]) -> bytes:
    return json.dumps({k: v for k, v in manifest.items() if k != DIGEST}, sort_keys=True,
                      separators=(",", ":")).encode()


def seal(manifest: dict[str, Any]) -> str:
    """``manifest`` (a record and its FILES) as the JSON text to write, with its DIGEST."""
    return json.dumps({**manifest, DIGEST: hashlib.sha256(_canonical(manifest)).hexdigest()}, indent=2,
                      sort_keys=True)


def unseal(path: Path) -> dict[str, Any]:
    """The manifest written at ``path`` by :func:`seal`; CheckpointError when it is missing, unreadable
    or damaged (its digest does not match)."""
    try:
        manifest = json.loads(Path(path).read_bytes())
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing: the save was interrupted before it completed",
                              hint="nothing to do: the previous checkpoint is used") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path} is unreadable ({type(exc).__name__}): the checkpoint's manifest is damaged",
                              hint="nothing to do: the previous checkpoint is used") from None
    files = manifest.get(FILES) if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(_is_entry(e) for e in files.values()):
        raise CheckpointError(f"{path} holds no manifest of the checkpoint's files",
                              hint="nothing to do: the previous checkpoint is used")
    if manifest.get(DIGEST) != hashlib.sha256(_canonical(manifest)).hexdigest():
        raise CheckpointError(f"{path} does not match its own digest: the checkpoint's manifest is damaged",
                              hint="nothing to do: the previous checkpoint is used")
    return manifest


def _is_entry(entry: Any) -> bool:
    return (isinstance(entry, dict) and isinstance(entry.get("size"), int) and isinstance(entry.get("sha256"), str)
            and len(entry["sha256"]) == 64)


def check_listing(root: Path, files: dict[str, Any], *, own: Iterable[str] = ()) -> None:
    """Every file of the manifest is there with its size, and nothing else is (but ``own``, the
    manifest's own file). Cheap (one stat per file), so every rank does it."""
    root = Path(root)
    present = {p.relative_to(root).as_posix() for p in root.rglob("*") if not p.is_dir()} if root.is_dir() else set()
    for name in sorted(files):
        path = root / name
        if name not in present:
            raise CheckpointError(f"{path} is missing (it is listed in the checkpoint's manifest)",
                                  hint="nothing to do: the previous checkpoint is used")
        size = path.stat().st_size
        if size != files[name]["size"]:
            what = "empty" if size == 0 else ("truncated" if size < files[name]["size"] else "longer than written")
            raise CheckpointError(f"{path} holds {size} bytes, its manifest says {files[name]['size']} ({what})",
                                  hint="nothing to do: the previous checkpoint is used")
    extra = sorted(present - set(files) - set(own))
    if extra:
        raise CheckpointError(f"{root / extra[0]} is not listed in the checkpoint's manifest",
                              hint="nothing to do: the previous checkpoint is used")


def mismatch(path: Path, entry: dict[str, Any], got: dict[str, Any]) -> CheckpointError | None:
    """The error for a file whose bytes are not those its manifest entry describes (None if they are)."""
    if got == {"size": entry["size"], "sha256": entry["sha256"]}:
        return None
    if got["size"] != entry["size"]:
        return CheckpointError(f"{path} holds {got['size']} bytes, its manifest says {entry['size']}",
                               hint="nothing to do: the previous checkpoint is used")
    return CheckpointError(f"{path} does not match the SHA-256 in its manifest (a changed byte)",
                           hint="nothing to do: the previous checkpoint is used")


def share(files: dict[str, Any], rank: int, world_size: int) -> list[str]:
    """The files this rank hashes when every rank checks part of one checkpoint: largest first, each to
    the rank with the fewest bytes so far (ties: the lowest rank), so every rank computes the same split."""
    loads = [0] * world_size
    mine = []
    for name in sorted(files, key=lambda n: (-files[n]["size"], n)):
        who = min(range(world_size), key=lambda r: (loads[r], r))
        loads[who] += files[name]["size"]
        if who == rank:
            mine.append(name)
    return mine


@dataclass
class Verified:
    """What checking a checkpoint cost: files and bytes hashed here, and the seconds it added."""

    files: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def add(self, other: "Verified") -> None:
        self.files, self.bytes, self.seconds = (self.files + other.files, self.bytes + other.bytes,
                                                self.seconds + other.seconds)

    def __str__(self) -> str:
        return f"verified {self.files} file(s), {self.bytes / 2**20:.1f} MiB, in {self.seconds:.3f} s"


def verify(root: Path, files: dict[str, Any], names: Iterable[str], threads: int | None = None) -> Verified:
    """Hash ``names`` (relative to ``root``, a few at a time) against ``files``; CheckpointError naming
    the first file that differs."""
    names = sorted(names)
    began = time.perf_counter()
    if names:
        with ThreadPoolExecutor(max_workers=min(threads or default_threads(), len(names))) as pool:
            got = list(pool.map(lambda n: hash_file(Path(root) / n), names))
        for name, entry in zip(names, got):
            error = mismatch(Path(root) / name, files[name], entry)
            if error is not None:
                raise error
    return Verified(len(names), sum(files[n]["size"] for n in names), time.perf_counter() - began)


def default_threads() -> int:
    """Hashing threads per process: this rank's CPUs (hashlib runs outside the GIL), at most 4."""
    try:
        return max(1, min(4, len(os.sched_getaffinity(0))))
    except AttributeError:  # not Linux
        return max(1, min(4, os.cpu_count() or 1))
