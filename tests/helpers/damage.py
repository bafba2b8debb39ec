"""Named ways to damage a checkpoint on disk, for the tests and the chaos benchmark that prove resume
survives them (what a crash, a full disk, bit rot, a lost file or an attacker leaves behind).

    damage(Path("ckpts/ckpt-00000080"), "truncate")           # half of __0_0.distcp gone
    damage(Path("ckpts/ckpt-00000040.pt"), "flip")            # one byte of the .pt inverted
    damage(path, "payload", marker=Path("/tmp/pwned"))        # a pickle that would `touch /tmp/pwned`

Accidents (truncate, zero, flip, delete) leave the manifest as it was, so verification catches them.
A payload is what someone who can write the checkpoint does: the file is replaced by a pickle whose
``__reduce__`` runs a shell command that creates ``marker``, and the manifest is re-sealed to match,
so only the restricted unpickling stands between it and the command (docs/security.md).
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import torch

from trainscale.checkpoint import integrity, layout

DAMAGES = ("truncate", "zero", "flip", "delete", "payload")
"""truncate: cut to half its size; zero: cut to 0 bytes; flip: one byte inverted (the middle one);
delete: removed; payload: replaced by a pickle that runs ``touch MARKER`` when unpickled unsafely."""


class Payload:
    """An object that, once unpickled with plain pickle, has run ``touch marker``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch '{self.marker}'",))


def payload_pickle(marker: Path) -> bytes:
    """A plain pickle that runs ``touch marker`` when loaded with ``pickle.load`` (torch's DCP reader)."""
    return pickle.dumps(Payload(Path(marker)))


def target_of(checkpoint: Path, kind: str, target: str | None = None) -> Path:
    """The file ``damage`` changes: ``target`` inside a sharded directory (default: DCP's index for a
    payload, else the first shard, else its largest file); for a rank-0 file the .pt itself, or its
    manifest for ``delete`` or ``target="manifest"``."""
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        return (
            layout.sidecar_path(checkpoint)
            if target == "manifest" or (kind == "delete" and target is None)
            else checkpoint
        )
    if target is not None:
        return checkpoint / target
    if kind == "payload":
        return checkpoint / (layout.DCP_INDEX if (checkpoint / layout.DCP_INDEX).exists() else layout.EXTRA)
    shards = sorted(checkpoint.glob("*.distcp"))
    if shards:
        return shards[0]
    files = [p for p in checkpoint.rglob("*") if p.is_file() and p.name != layout.MARKER]
    return max(files, key=lambda p: (p.stat().st_size, p.as_posix()))


def damage(checkpoint: Path, kind: str, *, target: str | None = None, marker: Path | None = None) -> Path:
    """Damage ``checkpoint`` (a ``ckpt-N.pt`` file or a ``ckpt-N/`` directory) the way ``kind`` names
    (:data:`DAMAGES`); returns the file changed. ``marker``: the file a payload would create."""
    if kind not in DAMAGES:
        raise ValueError(f"unknown damage {kind!r}; one of {', '.join(DAMAGES)}")
    victim = target_of(checkpoint, kind, target)
    if kind == "truncate":
        os.truncate(victim, victim.stat().st_size // 2)
    elif kind == "zero":
        os.truncate(victim, 0)
    elif kind == "flip":
        with open(victim, "r+b") as fh:
            fh.seek(victim.stat().st_size // 2)
            byte = fh.read(1)
            fh.seek(-1, os.SEEK_CUR)
            fh.write(bytes([byte[0] ^ 0xFF]))
    elif kind == "delete":
        victim.unlink()
    else:
        if marker is None:
            raise ValueError("a payload needs marker=, the file it would create")
        if victim.name.endswith(".pt"):  # a torch file: the payload rides inside a plausible checkpoint
            torch.save({"payload": Payload(Path(marker)), layout.RECORD: {"complete": True}}, victim)
        else:
            victim.write_bytes(payload_pickle(Path(marker)))
        _reseal(Path(checkpoint), victim)
    return victim


def _reseal(checkpoint: Path, changed: Path) -> None:
    """Rewrite the manifest so that it describes ``changed`` as it now is (a deliberate tamperer's step)."""
    manifest_path = checkpoint / layout.MARKER if checkpoint.is_dir() else layout.sidecar_path(checkpoint)
    manifest = json.loads(manifest_path.read_text())
    root = checkpoint if checkpoint.is_dir() else checkpoint.parent
    manifest[integrity.FILES][changed.relative_to(root).as_posix()] = integrity.hash_file(changed)
    manifest_path.write_text(integrity.seal(manifest))


CRAFTS = ("outside-path", "huge-length", "shifted-offset", "renamed")
"""What someone who can write a sharded checkpoint crafts from DCP's own allow-listed types, the manifest
re-sealed to match: outside-path (a non-tensor entry read from an absolute host path); huge-length (one read
of 2^40 bytes); shifted-offset (a tensor's bytes 4 bytes off: they verify, but do not load); renamed (a link
``ckpt-<N+10>`` to the newest, so its name and its record disagree on the step)."""


def craft(checkpoint: Path, kind: str) -> Path:
    """Craft ``checkpoint`` (a sharded ``ckpt-N/``; "renamed" a rank-0 file too) the way ``kind`` names
    (:data:`CRAFTS`); returns the path a resume now meets first."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    from trainscale.checkpoint.dcp_io import read_metadata

    checkpoint = Path(checkpoint)
    if kind == "renamed":  # a sharded directory, or a rank-0 file with its manifest
        step = int(checkpoint.name.split("-")[1].split(".")[0]) + 10
        link = checkpoint.with_name(f"ckpt-{step:08d}{'' if checkpoint.is_dir() else '.pt'}")
        link.symlink_to(checkpoint.name)
        if not checkpoint.is_dir():
            layout.sidecar_path(link).symlink_to(layout.sidecar_path(checkpoint).name)
        return link
    index = checkpoint / layout.DCP_INDEX
    metadata = read_metadata(index)
    kinds = metadata.state_dict_metadata
    for key, where in metadata.storage_data.items():
        is_bytes = isinstance(kinds.get(key.fqn), BytesStorageMetadata)
        if kind == "outside-path" and is_bytes:
            where.relative_path = "/etc/hostname"
            break
        if kind == "huge-length" and is_bytes:
            where.length = 2**40
            break
        if kind == "shifted-offset" and not is_bytes:
            where.offset += 4
            break
    else:
        raise ValueError(f"no entry to craft {kind!r} in {checkpoint}")
    index.write_bytes(pickle.dumps(metadata))
    _reseal(checkpoint, index)
    return checkpoint
