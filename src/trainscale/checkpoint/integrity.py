"""What a checkpoint's manifest says and how it is checked: every file's size and SHA-256.

The hashes are taken *while* the bytes are written (:class:`HashingStream` sits between the writer
and the file: torch.save's stream, DCP's shard streams), so a save never reads its own files back.
Only files written by someone else's code (a strategy's native files: DeepSpeed opens its own) are
hashed by reading them once, before the checkpoint is made visible.

A manifest is JSON: the checkpoint's record, ``"files": {relative path: entry}`` and ``"digest"``,
the SHA-256 of all the rest (canonical JSON), so that a flipped byte in the manifest itself is
caught too. An entry is ``{"size": bytes, "piece": PIECE, "sha256": [one per PIECE bytes]}``: the
SHA-256 of each 16 MiB piece rather than of the whole file, so that checking runs on every core
(hashlib hashes outside the GIL) instead of one, while writing still hashes each byte once. A file
of at most one piece has the digest ``sha256sum`` prints.

It detects accidents (truncation, bit rot, a half-copied directory, a lost shard); it authenticates
nothing: whoever can write a checkpoint can rewrite its manifest (docs/security.md: what keeps a
crafted checkpoint from running code is the restricted unpickling).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainscale.errors import CheckpointError
from trainscale.topology.apply import current_affinity

FILES, DIGEST = "files", "digest"
PIECE = 16 << 20
"""Bytes per hashed piece: small enough to spread one shard over a node's cores, large enough that a
200 GB checkpoint's manifest stays ~1 MB."""
AGAIN = "nothing to do: the previous checkpoint is used"


class HashingStream:
    """A write-only stream that forwards every byte to ``raw`` and hashes it on the way, piece by piece.

    Sequential writes only: seeking back would make the hash differ from the file, so it cannot
    (torch.save and DCP's shard writer never seek). Closing it flushes ``raw``; whoever opened
    ``raw`` closes it."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw
        self._pieces: list[str] = []
        self._sha = hashlib.sha256()
        self._filled = 0  # bytes in the current piece
        self.size = 0
        self.closed = False

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        written = self.raw.write(view)
        written = len(view) if written is None else written
        view = view[:written]
        while view:
            take = min(len(view), PIECE - self._filled)
            self._sha.update(view[:take])
            self._filled += take
            view = view[take:]
            if self._filled == PIECE:
                self._pieces.append(self._sha.hexdigest())
                self._sha, self._filled = hashlib.sha256(), 0
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
        """This stream's manifest entry: the size and piece hashes of everything written so far."""
        last = [self._sha.hexdigest()] if self._filled or not self._pieces else []
        return {"size": self.size, "piece": PIECE, "sha256": self._pieces + last}


def _hash_piece(path: Path, index: int, piece: int) -> str:
    # Read, not mapped: a file truncated while mapped would kill the process with SIGBUS.
    sha = hashlib.sha256()
    with open(path, "rb", buffering=0) as fh:
        fh.seek(index * piece)
        left, buffer = piece, bytearray(min(piece, 8 << 20))
        view = memoryview(buffer)
        while left and (n := fh.readinto(view[: min(left, len(buffer))])):
            sha.update(view[:n])
            left -= n
    return sha.hexdigest()


def hash_file(path: Path) -> dict[str, Any]:
    """A file's manifest entry, by reading it (for files someone else's code wrote)."""
    stream = HashingStream(_Discard())
    with open(path, "rb", buffering=0) as fh:
        buffer = bytearray(8 << 20)
        view = memoryview(buffer)
        while n := fh.readinto(buffer):
            stream.write(view[:n])
    return stream.entry()


class _Discard:
    def write(self, data: Any) -> int:
        return len(data)


def _pieces(size: int, piece: int) -> int:
    return max(1, -(-size // piece))


def _canonical(manifest: dict[str, Any]) -> bytes:
    return json.dumps(
        {k: v for k, v in manifest.items() if k != DIGEST}, sort_keys=True, separators=(",", ":")
    ).encode()


def seal(manifest: dict[str, Any]) -> str:
    """``manifest`` (a record and its FILES) as the JSON text to write, with its DIGEST."""
    return json.dumps({**manifest, DIGEST: hashlib.sha256(_canonical(manifest)).hexdigest()}, indent=1, sort_keys=True)


def unseal(path: Path) -> dict[str, Any]:
    """The manifest written at ``path`` by :func:`seal`; CheckpointError when it is missing, unreadable
    or damaged (its digest does not match)."""
    try:
        manifest = json.loads(Path(path).read_bytes())
    except FileNotFoundError:
        raise CheckpointError(f"{path} is missing: the save was interrupted before it completed", hint=AGAIN) from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(
            f"{path} is unreadable ({type(exc).__name__}): the checkpoint's manifest is damaged", hint=AGAIN
        ) from None
    files = manifest.get(FILES) if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not all(_is_entry(e) for e in files.values()):
        raise CheckpointError(f"{path} holds no manifest of the checkpoint's files", hint=AGAIN)
    if manifest.get(DIGEST) != hashlib.sha256(_canonical(manifest)).hexdigest():
        raise CheckpointError(f"{path} does not match its own digest: the checkpoint's manifest is damaged", hint=AGAIN)
    return manifest


def _is_entry(entry: Any) -> bool:
    if not (
        isinstance(entry, dict)
        and isinstance(entry.get("size"), int)
        and isinstance(entry.get("piece"), int)
        and entry["piece"] > 0
        and isinstance(entry.get("sha256"), list)
    ):
        return False
    digests = entry["sha256"]
    return len(digests) == _pieces(entry["size"], entry["piece"]) and all(
        isinstance(d, str) and len(d) == 64 for d in digests
    )


def check_listing(root: Path, files: dict[str, Any], *, own: Iterable[str] = ()) -> None:
    """Every file of the manifest is there with its size, and nothing else is (but ``own``, the
    manifest's own file). Cheap (one stat per file), so every rank does it."""
    root = Path(root)
    present = {p.relative_to(root).as_posix() for p in root.rglob("*") if not p.is_dir()} if root.is_dir() else set()
    for name in sorted(files):
        if name not in present:
            raise CheckpointError(f"{root / name} is missing (it is listed in the checkpoint's manifest)", hint=AGAIN)
        error = check_size(root / name, files[name])
        if error is not None:
            raise error
    extra = sorted(present - set(files) - set(own))
    if extra:
        raise CheckpointError(f"{root / extra[0]} is not listed in the checkpoint's manifest", hint=AGAIN)


def check_size(path: Path, entry: dict[str, Any]) -> CheckpointError | None:
    """The error for a file whose size is not its manifest's (None when it is)."""
    size = Path(path).stat().st_size
    if size == entry["size"]:
        return None
    what = "empty" if size == 0 else ("truncated" if size < entry["size"] else "longer than written")
    return CheckpointError(f"{path} holds {size} bytes, its manifest says {entry['size']} ({what})", hint=AGAIN)


@dataclass
class Verified:
    """What checking a checkpoint cost on this rank: files and bytes hashed, and the seconds hashing
    took (before DCP's load for a sharded checkpoint; beside torch.load for a rank-0 file)."""

    files: int = 0
    bytes: int = 0
    seconds: float = 0.0

    def add(self, other: Verified) -> None:
        self.files, self.bytes, self.seconds = (
            self.files + other.files,
            self.bytes + other.bytes,
            self.seconds + other.seconds,
        )

    def __str__(self) -> str:
        return f"verified {self.files} file(s), {self.bytes / 2**20:.1f} MiB, in {self.seconds:.3f} s"


def verify(
    root: Path,
    files: dict[str, Any],
    names: Iterable[str],
    *,
    rank: int = 0,
    world_size: int = 1,
    threads: int | None = None,
) -> Verified:
    """Check ``names`` (relative to ``root``) against ``files``: every size (a stat each), then this
    rank's pieces, ``rank::world_size`` of all their pieces in name order (so ranks that each call
    this with their own ``rank`` hash every piece once between them, and the caller makes them
    agree), on ``threads`` threads (default: this process's CPUs). CheckpointError names the first
    file that differs."""
    names = sorted(names)
    began = time.perf_counter()
    for name in names:
        error = check_size(Path(root) / name, files[name])
        if error is not None:
            raise error
    jobs = [(name, i) for name in names for i in range(_pieces(files[name]["size"], files[name]["piece"]))]
    mine = jobs[rank::world_size]
    if mine:
        with ThreadPoolExecutor(max_workers=min(threads or default_threads(), len(mine))) as pool:
            got = list(pool.map(lambda job: _hash_piece(Path(root) / job[0], job[1], files[job[0]]["piece"]), mine))
        for (name, i), digest in zip(mine, got):
            if digest != files[name]["sha256"][i]:
                piece = files[name]["piece"]
                raise CheckpointError(
                    f"{Path(root) / name} does not match the SHA-256 in its manifest (a changed "
                    f"byte in bytes {i * piece}-{min((i + 1) * piece, files[name]['size'])})",
                    hint=AGAIN,
                )
    hashed = sum(min(files[n]["piece"], files[n]["size"] - i * files[n]["piece"]) for n, i in mine)
    return Verified(len({n for n, _ in mine}), hashed, time.perf_counter() - began)


def default_threads() -> int:
    """Hashing threads per process: this process's CPUs (a rank's own, where it is bound), at most 16."""
    return max(1, min(16, len(current_affinity())))
