"""What a checkpoint must be before it is resumed from, on one process: every file as its manifest
says (size and SHA-256, hashed while written), nothing that unpickles into code, and a directory that
can be written to. Each damage of tests/helpers/damage.py to the newest checkpoint makes resume fall back
to the previous one with one warning naming the file; a payload never runs. The same on 2 real gloo
ranks (every rank agrees): tests/integration/test_sharded_checkpoint.py."""

from __future__ import annotations

import logging
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from helpers.damage import CRAFTS, DAMAGES, craft, damage, payload_pickle

import trainscale
from trainscale.checkpoint import Checkpointer, ModelState, find_latest, integrity, layout
from trainscale.checkpoint.state import DCP
from trainscale.errors import CheckpointError
from trainscale.strategies import get_strategy
from trainscale.strategies.base import OptimizerSpec


@pytest.fixture
def rt(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # torch sets it on first use
    with trainscale.init(environ={}, set_threads=False) as runtime:
        yield runtime


def _warnings(caplog) -> list[str]:
    return [
        r.getMessage() for r in caplog.records if r.name == "trainscale.checkpoint" and r.levelno >= logging.WARNING
    ]


class Shards(ModelState):
    """Any entries under "model", kept as DCP shards as FSDP keeps its state (for crafted contents)."""

    storage = DCP

    def __init__(self, entries: dict) -> None:
        self.entries = entries

    def state_dict(self) -> dict:
        return {"model": self.entries}

    def load_state_dict(self, state_dict: dict) -> None:
        self.entries = state_dict["model"]


# ------------------------------------------------------------------------------ rank-0 files
@pytest.mark.parametrize("kind", DAMAGES)
def test_a_damaged_newest_file_checkpoint_falls_back_to_the_previous_with_one_warning(kind, tmp_path, rt, caplog):
    """truncate/zero/flip the .pt, delete its manifest, or a code payload with a re-sealed manifest. The
    zero-length .pt used to crash resume with IndexError, a flipped byte used to load silently."""
    ck = Checkpointer(tmp_path / "ck", rt, keep=5)
    ck.save(1, {"w": torch.arange(1000.0)})
    newest = ck.save(2, {"w": torch.zeros(1000)})
    changed = damage(newest, kind, marker=tmp_path / "pwned")
    with caplog.at_level(logging.INFO, logger="trainscale.checkpoint"):
        found = ck.latest()
    assert found.step == 1 and torch.equal(found.contents["w"], torch.arange(1000.0))
    assert found.verified.files == 1 and found.verified.bytes == found.path.stat().st_size
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and changed.name in warnings[0], warnings
    assert not (tmp_path / "pwned").exists()


# ------------------------------------------------------------------------------ sharded (DCP) directories
SHARDED_CASES = [
    ("truncate", None),
    ("zero", None),
    ("flip", None),
    ("delete", None),
    ("payload", None),
    ("payload", layout.EXTRA),
    ("flip", layout.EXTRA),
    ("truncate", layout.DCP_INDEX),
    ("flip", layout.MARKER),
    ("delete", layout.MARKER),
]


def _fsdp(rt, seed: int):
    strategy = get_strategy("fsdp")
    torch.manual_seed(seed)
    model, opt = strategy.wrap(torch.nn.Linear(16, 8), OptimizerSpec(torch.optim.Adam, {"lr": 0.1}), rt)
    strategy.backward_loss(model(torch.ones(2, 16)).sum(), model)
    strategy.micro_step(opt, model, last=True)
    return strategy, model, opt


def _weights(strategy, model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in strategy.full_model_state(model).items()}


@pytest.mark.parametrize(("kind", "target"), SHARDED_CASES, ids=[f"{k}-{t or 'default'}" for k, t in SHARDED_CASES])
def test_a_damaged_newest_sharded_checkpoint_falls_back_to_the_previous_with_one_warning(
    kind, target, tmp_path, rt, caplog
):
    """Truncating __0_0.distcp used to make every restart fail ("written for another model?"); a
    crafted .metadata ran its payload on resume."""
    strategy, model, opt = _fsdp(rt, seed=1)
    ck = Checkpointer(tmp_path / "ck", rt, strategy=strategy, keep=5)
    ck.save(1, {"model": strategy.checkpoint_state(model, opt), "step": 1})
    saved = _weights(strategy, model)
    strategy.backward_loss(model(torch.ones(2, 16)).sum(), model)
    strategy.micro_step(opt, model, last=True)
    newest = ck.save(2, {"model": strategy.checkpoint_state(model, opt), "step": 2})
    changed = damage(newest, kind, target=target, marker=tmp_path / "pwned")

    strategy, model, opt = _fsdp(rt, seed=2)  # other weights: only the checkpoint can restore step 1's
    with caplog.at_level(logging.INFO, logger="trainscale.checkpoint"):
        found = ck.restore({"model": strategy.checkpoint_state(model, opt)})
    assert found.step == 1 and found.contents["step"] == 1
    restored = _weights(strategy, model)
    assert all(torch.equal(restored[k], saved[k]) for k in saved)
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and changed.name in warnings[0], warnings
    assert not (tmp_path / "pwned").exists()


def test_a_crafted_dcp_entry_is_refused_while_choosing_and_the_previous_checkpoint_is_used(tmp_path, rt, caplog):
    """A non-tensor entry of the shards (pickled by DCP into __0_0.distcp, listed in a valid manifest)
    is loaded with weights_only while the checkpoint is chosen, so it is skipped, not half-loaded."""
    from helpers.damage import Payload

    ck = Checkpointer(tmp_path / "ck", rt, strategy=get_strategy("fsdp"), keep=5)
    ck.save(1, {"model": Shards({"w": torch.ones(4)}), "step": 1})
    ck.save(2, {"model": Shards({"w": torch.ones(4), "evil": Payload(tmp_path / "pwned")}), "step": 2})
    with caplog.at_level(logging.WARNING, logger="trainscale.checkpoint"):
        assert ck.latest().step == 1
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and "__0_0.distcp holds the entry model.evil" in warnings[0] and "refused" in warnings[0]
    assert not (tmp_path / "pwned").exists()


def test_a_file_the_manifest_does_not_list_makes_a_checkpoint_unverified(tmp_path, rt, caplog):
    ck = Checkpointer(tmp_path / "ck", rt, strategy=get_strategy("fsdp"), keep=5)
    ck.save(1, {"model": Shards({"w": torch.ones(4)}), "step": 1})
    newest = ck.save(2, {"model": Shards({"w": torch.ones(4)}), "step": 2})
    shutil.copy(newest / "__0_0.distcp", newest / "__1_0.distcp")  # e.g. a shard of another save copied in
    with caplog.at_level(logging.WARNING, logger="trainscale.checkpoint"):
        assert ck.latest().step == 1
    assert "__1_0.distcp is not listed in the checkpoint's manifest" in caplog.text


def test_torch_s_own_reader_would_run_a_crafted_metadata_trainscale_s_refuses_it(tmp_path):
    """The payload is live (torch's FileSystemReader runs it); trainscale's reader never does."""
    from torch.distributed.checkpoint import FileSystemReader

    from trainscale.checkpoint.dcp_io import SafeReader

    ran, refused = tmp_path / "ran", tmp_path / "refused"
    for name, marker in (("torch", ran), ("trainscale", refused)):
        (tmp_path / name).mkdir()
        (tmp_path / name / ".metadata").write_bytes(payload_pickle(marker))
    try:
        FileSystemReader(tmp_path / "torch").read_metadata()
    except Exception:  # what the payload returned is no Metadata; the command ran first
        pass
    assert ran.exists()
    with pytest.raises(CheckpointError, match=r"names posix.system, which is not one of DCP's metadata types"):
        SafeReader(tmp_path / "trainscale").read_metadata()
    assert not refused.exists()


def test_the_allow_list_reads_what_torch_writes(tmp_path, rt):
    """Real DCP indexes of several optimizers' states, bf16 and fp32 tensors and two ranks' shards
    (the fixture) load through the restricted unpickler; so does a pickle of DCP's classes only."""
    from torch.distributed.checkpoint.metadata import Metadata

    from trainscale.checkpoint.dcp_io import read_metadata

    optimizers = [
        (torch.optim.Adam, {"lr": 0.1}),
        (torch.optim.AdamW, {"lr": 0.1, "amsgrad": True}),
        (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
        (torch.optim.Adagrad, {"lr": 0.1}),
        (torch.optim.RMSprop, {"lr": 0.1, "centered": True}),
    ]
    for i, (cls, kwargs) in enumerate(optimizers):
        strategy = get_strategy("fsdp")
        net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 2))
        if i % 2:
            net = net.to(torch.bfloat16)
        model, opt = strategy.wrap(net, OptimizerSpec(cls, kwargs), rt)
        strategy.backward_loss(model(torch.ones(2, 4, dtype=next(net.parameters()).dtype)).float().sum(), model)
        strategy.micro_step(opt, model, last=True)
        path = Checkpointer(tmp_path / cls.__name__, rt, strategy=strategy).save(
            1, {"model": strategy.checkpoint_state(model, opt), "step": 1}
        )
        metadata = read_metadata(path / layout.DCP_INDEX)
        assert isinstance(metadata, Metadata) and any(
            k.startswith("optimizer.state") for k in metadata.state_dict_metadata
        )
    fixture = Path(__file__).parents[1] / "fixtures" / "checkpoints" / "fsdp" / "ckpt-00000002" / layout.DCP_INDEX
    assert isinstance(read_metadata(fixture), Metadata)


def test_saves_hash_what_they_write_and_never_read_it_back(tmp_path, rt, monkeypatch):
    strategy, model, opt = _fsdp(rt, seed=1)

    def no_reading(path):
        raise AssertionError(f"{path} was read back to hash it")

    monkeypatch.setattr(integrity, "hash_file", no_reading)
    monkeypatch.setattr(integrity, "_hash_piece", no_reading)
    file = Checkpointer(tmp_path / "file", rt).save(1, {"w": torch.ones(4)})
    directory = Checkpointer(tmp_path / "dcp", rt, strategy=strategy).save(
        1, {"model": strategy.checkpoint_state(model, opt), "step": 1}
    )
    monkeypatch.undo()
    manifest = integrity.unseal(layout.sidecar_path(file))
    assert manifest[integrity.FILES] == {file.name: integrity.hash_file(file)}
    marker = integrity.unseal(directory / layout.MARKER)
    assert sorted(marker[integrity.FILES]) == [".metadata", "__0_0.distcp", "extra.pt"]
    for name, entry in marker[integrity.FILES].items():
        assert integrity.hash_file(directory / name) == entry
    assert not list(directory.glob(".files-*"))  # the per-rank records were merged into the marker


@pytest.mark.parametrize("size", [0, 999, 1000, 3500])
def test_pieces_hashed_while_writing_are_those_of_the_file_and_a_flip_names_its_piece(size, tmp_path, monkeypatch):
    import hashlib
    import os

    monkeypatch.setattr(integrity, "PIECE", 1000)
    data = os.urandom(size)
    with open(tmp_path / "f", "wb") as fh:
        stream = integrity.HashingStream(fh)
        for start in range(0, size, 333):  # writes that straddle the pieces' boundaries
            stream.write(data[start : start + 333])
    entry = stream.entry()
    pieces = [data[i : i + 1000] for i in range(0, size, 1000)] or [b""]
    assert entry == {"size": size, "piece": 1000, "sha256": [hashlib.sha256(p).hexdigest() for p in pieces]}
    assert integrity.hash_file(tmp_path / "f") == entry
    assert integrity.verify(tmp_path, {"f": entry}, ["f"], threads=3).bytes == size
    shares = [integrity.verify(tmp_path, {"f": entry}, ["f"], rank=r, world_size=2).bytes for r in (0, 1)]
    assert sum(shares) == size  # two ranks hash every piece once between them
    if size > 2000:
        damage(tmp_path / "f", "flip")  # byte 1750: the second piece, rank 1's of 2
        with pytest.raises(
            CheckpointError,
            match=r"f does not match the SHA-256 in its manifest \(a changed byte "
            r"in bytes 1000-2000\)",
        ):
            integrity.verify(tmp_path, {"f": entry}, ["f"], threads=3)
        integrity.verify(tmp_path, {"f": entry}, ["f"], rank=0, world_size=2)  # not rank 0's piece
        with pytest.raises(CheckpointError, match="does not match"):
            integrity.verify(tmp_path, {"f": entry}, ["f"], rank=1, world_size=2)


# ------------------------------------------------------------------------------ where checkpoints go
@pytest.fixture
def mount(tmp_path):
    """``mount(options)``: a fresh tmpfs under tmp_path (root only); skipped where mounting is not allowed."""
    mounted = []

    def make(options: str) -> Path:
        where = tmp_path / f"mnt{len(mounted)}"
        where.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True)
        if done.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
        mounted.append(where)
        return where

    yield make
    for where in mounted:  # lazily: a file a failed test left open must not keep the mount past the test
        subprocess.run(["umount", "--lazy", str(where)], check=True)


@pytest.mark.parametrize("where", ["file", "dcp-shards", "dcp-extra"])
def test_a_full_disk_fails_the_save_naming_the_directory_and_the_need_and_leaves_the_previous_newest(
    where, tmp_path, rt, mount
):
    """A real ENOSPC (a 1 MiB tmpfs): in torch.save of a rank-0 file, in DCP's shard writer, in the
    sharded checkpoint's extra.pt."""
    disk = mount("size=1m")
    strategy = get_strategy("ddp" if where == "file" else "fsdp")
    model, opt = strategy.wrap(torch.nn.Linear(256, 256), OptimizerSpec(torch.optim.SGD, {"lr": 0.1}), rt)
    ck = Checkpointer(disk / "ck", rt, strategy=strategy, keep=5)
    ck.save(1, {"model": strategy.checkpoint_state(model, opt), "step": 1})  # 257 KiB of weights: fits
    big = torch.zeros(256 * 1024)  # 1 MiB more: does not
    state = (
        {"model": {"w": big}, "step": 2}
        if where == "dcp-shards"
        else {"model": strategy.checkpoint_state(model, opt), "step": 2, "big": big}
    )
    with pytest.raises(
        CheckpointError,
        match=rf"the disk holding {disk / 'ck'} is full: saving the checkpoint of "
        r"step 2 failed \(.*need.? about 1\.\d MiB.* are free",
    ) as caught:
        ck.save(2, state)
    assert "--checkpoint-dir" in caught.value.hint
    listed = sorted(p.name for p in (disk / "ck").iterdir() if p.name != ".trainscale.lock")  # the run's lock
    assert listed == (["ckpt-00000001.pt", "ckpt-00000001.pt.json"] if where == "file" else ["ckpt-00000001"])
    assert ck.latest().step == 1
    ck.close()  # its lock's file is open on the tmpfs the fixture unmounts


def test_a_full_disk_under_a_background_sharded_save_says_so(tmp_path, rt, mount):
    """issue 35 item 4: the background save's shard writer (torch's zip stream) reported a full disk as
    "RuntimeError: [enforce fail at inline_container.cc:672] unexpected pos"."""
    disk = mount("size=1m")
    strategy = get_strategy("fsdp")
    model, opt = strategy.wrap(torch.nn.Linear(256, 256), OptimizerSpec(torch.optim.SGD, {"lr": 0.1}), rt)
    ck = Checkpointer(disk / "ck", rt, strategy=strategy, keep=5, asynchronous=True)
    ck.save(1, {"model": strategy.checkpoint_state(model, opt), "step": 1})
    ck.save(2, {"model": Shards({"w": torch.zeros(256 * 1024)}), "step": 2})  # 1 MiB more, in the background
    with pytest.raises(
        CheckpointError,
        match=rf"the disk holding {disk / 'ck'} is full: saving the checkpoint of "
        r"step 2 failed",
    ) as caught:
        ck.wait()
    assert "inline_container" not in str(caught.value) and "--checkpoint-dir" in caught.value.hint
    assert ck.latest().step == 1
    ck.close()


def test_a_link_named_like_a_checkpoint_neither_displaces_a_real_one_nor_blocks_a_save(tmp_path, rt, caplog):
    """Found by the chaos benchmark: a crafted link ckpt-20 -> ckpt-10, skipped on resume, counted as the newest
    by retention (keep=2): the real ckpt-10 was deleted at the save of step 15, and the save of step 20 failed on
    the link left dangling (NotADirectoryError). A copy under another step's name is refused for its record."""
    strategy, model, opt = _fsdp(rt, seed=1)
    directory = tmp_path / "ck"
    ck = Checkpointer(directory, rt, strategy=strategy, keep=2)
    for step in (5, 10):
        ck.save(step, {"model": strategy.checkpoint_state(model, opt), "step": step})
    ck.close()
    craft(directory / "ckpt-00000010", "renamed")  # ckpt-00000020 -> ckpt-00000010
    ck = Checkpointer(directory, rt, strategy=strategy, keep=2)
    with caplog.at_level(logging.WARNING, logger="trainscale.checkpoint"):
        assert ck.restore({"model": strategy.checkpoint_state(model, opt)}).step == 10
    assert "ckpt-00000020 is a symbolic link" in " ".join(_warnings(caplog))
    ck.save(15, {"model": strategy.checkpoint_state(model, opt), "step": 15})
    assert (directory / "ckpt-00000010").is_dir()  # the link is not one of the 2 kept
    ck.save(20, {"model": strategy.checkpoint_state(model, opt), "step": 20})
    assert not (directory / "ckpt-00000020").is_symlink() and ck.latest().step == 20
    shutil.copytree(directory / "ckpt-00000020", directory / "ckpt-00000030")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trainscale.checkpoint"):
        assert ck.latest().step == 20
    assert "is named for step 30, but its record says step 20" in " ".join(_warnings(caplog))
    ck.close()


def test_a_background_sharded_save_touches_no_cuda_stream_where_cuda_is_available(tmp_path, rt, monkeypatch):
    """issue 39 defect 1: with CUDA available, torch's overlapping loader synced current_stream() from DCP's
    writer thread, on GPU 0 whatever the rank's device (a CUDA context per rank there on an 8-GPU node)."""
    touched = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda *a, **k: touched.append(a) or pytest.fail("stream"))
    strategy = get_strategy("fsdp")
    model, opt = strategy.wrap(torch.nn.Linear(64, 64), OptimizerSpec(torch.optim.SGD, {"lr": 0.1}), rt)
    for asynchronous in (True, False):
        ck = Checkpointer(tmp_path / f"ck-{asynchronous}", rt, strategy=strategy, keep=5, asynchronous=asynchronous)
        ck.save(1, {"model": strategy.checkpoint_state(model, opt), "step": 1})
        ck.wait()
        assert ck.latest().step == 1
        ck.close()
    assert touched == []


def test_an_unusable_checkpoint_directory_is_refused_when_the_checkpointer_is_made(tmp_path, rt, mount):
    (tmp_path / "file").write_text("not a directory")
    with pytest.raises(
        CheckpointError,
        match=r"--checkpoint-dir .*file/ck is unusable: .*file is a file, not a "
        "directory",
    ):
        Checkpointer(tmp_path / "file" / "ck", rt)
    read_only = mount("ro,size=64k")
    with pytest.raises(CheckpointError, match=r"unusable: no file can be created in .*: Read-only file system"):
        Checkpointer(read_only / "ck", rt, strategy=get_strategy("fsdp"))
    Checkpointer(tmp_path / "new" / "ck", rt)  # a missing directory is fine: the first save makes it
    assert not (tmp_path / "new").exists()


def test_damage_names_what_it_changed(tmp_path, rt):
    path = Checkpointer(tmp_path / "ck", rt).save(1, {"w": torch.ones(8)})
    before = path.read_bytes()
    assert damage(path, "flip") == path and path.read_bytes() != before and len(path.read_bytes()) == len(before)
    assert damage(path, "delete") == layout.sidecar_path(path) and not layout.sidecar_path(path).exists()
    with pytest.raises(ValueError, match="one of truncate, zero, flip, delete, payload"):
        damage(path, "melt")
    shutil.rmtree(tmp_path / "ck")
    assert find_latest(tmp_path / "ck") is None


@pytest.mark.parametrize("kind", CRAFTS)
def test_a_crafted_checkpoint_of_allow_listed_types_is_skipped_like_a_damaged_one(kind, tmp_path, rt, caplog):
    """issue 35 item 3: an index placing an entry in a host file or asking for 2^40 bytes (once a MemoryError on
    every rank that stopped the resume), a tensor 4 bytes off with the manifest re-sealed (once a failure inside
    DCP's load after the checkpoint was chosen, with torch's advice to load with weights_only=False), a link
    named for another step: each is skipped with one warning, and the previous checkpoint is resumed."""
    strategy, model, opt = _fsdp(rt, seed=1)
    ck = Checkpointer(tmp_path / "ck", rt, strategy=strategy, keep=5)
    ck.save(1, {"model": strategy.checkpoint_state(model, opt), "step": 1})
    saved = _weights(strategy, model)
    strategy.backward_loss(model(torch.ones(2, 16)).sum(), model)
    strategy.micro_step(opt, model, last=True)
    newest = ck.save(2, {"model": strategy.checkpoint_state(model, opt), "step": 2})
    if kind == "renamed":
        saved = _weights(strategy, model)  # the real newest is resumed, under its own name
    met = craft(newest, kind)

    strategy, model, opt = _fsdp(rt, seed=2)
    with caplog.at_level(logging.WARNING, logger="trainscale.checkpoint"):
        found = ck.restore({"model": strategy.checkpoint_state(model, opt)})
    assert found.step == (2 if kind == "renamed" else 1), found.path
    restored = _weights(strategy, model)
    assert all(torch.equal(restored[k], saved[k]) for k in saved)
    warnings = _warnings(caplog)
    assert len(warnings) == 1 and met.name in warnings[0], warnings
    assert "weights_only" not in warnings[0] and "False" not in warnings[0], warnings
    expected = {
        "outside-path": "'/etc/hostname', which is not a file of this checkpoint's manifest",
        "huge-length": "+1099511627776 of __0_0.distcp",
        "shifted-offset": "loading it failed",
        "renamed": "is a symbolic link to ckpt-00000002, not a checkpoint trainscale wrote",
    }[kind]
    assert expected in warnings[0], warnings
