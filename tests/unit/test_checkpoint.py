"""Atomic rank-0 checkpoints: complete or absent, private, safe to load, newest good one wins."""

from __future__ import annotations

import os
import stat

import pytest
import torch

import trainscale
from trainscale.checkpoint import Checkpointer, atomic_torch_save, find_latest, list_checkpoints, load_file
from trainscale.errors import CheckpointError


@pytest.fixture
def rt():
    with trainscale.init(environ={}, set_threads=False) as runtime:
        yield runtime


def test_save_and_latest_roundtrip(tmp_path, rt):
    ck = Checkpointer(tmp_path, rt, keep=2)
    for step in (10, 20, 30):
        ck.save(step, {"w": torch.full((3,), float(step)), "step": step})
    assert [s for s, _ in list_checkpoints(tmp_path)] == [30, 20]  # pruned to keep=2
    found = ck.latest()
    assert found.step == 30 and torch.equal(found.state["w"], torch.full((3,), 30.0))
    meta = found.state["trainscale"]
    assert meta["world_size"] == 1 and meta["strategy"] == "ddp" and meta["version"] == trainscale.__version__


def test_files_are_private(tmp_path, rt):
    path = Checkpointer(tmp_path, rt).save(1, {"x": torch.zeros(1)})
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def test_exception_while_saving_leaves_previous_checkpoint_untouched(tmp_path, rt, monkeypatch):
    ck = Checkpointer(tmp_path, rt)
    good = ck.save(1, {"x": torch.ones(4)})
    before = good.read_bytes()

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        ck.save(2, {"x": torch.zeros(4)})
    monkeypatch.undo()
    assert good.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [good.name]  # no temp file, no half file
    assert ck.latest().step == 1


def test_corrupt_newest_is_skipped_with_warning(tmp_path, rt, caplog):
    ck = Checkpointer(tmp_path, rt, keep=5)
    ck.save(1, {"x": torch.ones(2)})
    newest = ck.save(2, {"x": torch.ones(2)})
    newest.write_bytes(newest.read_bytes()[:100])  # truncated
    found = find_latest(tmp_path)
    assert found.step == 1
    assert "unreadable" in caplog.text


def test_malicious_pickle_is_refused_and_never_runs(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    path = tmp_path / "ckpt-00000001.pt"
    torch.save({"payload": Evil(), "trainscale": {"complete": True}}, path)
    with pytest.raises(CheckpointError, match="refused"):
        load_file(path)
    assert not marker.exists()


def test_file_without_completion_record_is_not_complete(tmp_path):
    path = tmp_path / "ckpt-00000005.pt"
    atomic_torch_save({"x": torch.ones(1)}, path)
    with pytest.raises(CheckpointError, match="not a complete"):
        load_file(path)


def test_strategy_mismatch_names_the_fix(tmp_path, rt):
    Checkpointer(tmp_path, rt, strategy="ddp").save(1, {"x": torch.ones(1)})
    with pytest.raises(CheckpointError, match="--strategy ddp"):
        Checkpointer(tmp_path, rt, strategy="fsdp").latest()


SAVER = """
import sys, torch, trainscale
from trainscale.checkpoint import Checkpointer
with trainscale.init(environ={}, set_threads=False) as rt:
    ck = Checkpointer(sys.argv[1], rt, keep=5)
    ck.save(1, {"x": torch.ones(8)})
    print("first saved", flush=True)
    ck.save(2, {"x": torch.randn(64, 1024, 1024)})  # 256 MB: slow enough to be killed midway
"""


def test_sigkill_during_save_leaves_previous_checkpoint_and_is_never_loaded(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "saver.py"
    script.write_text(SAVER)
    ckdir = tmp_path / "ck"
    proc = subprocess.Popen([sys.executable, str(script), str(ckdir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "first saved"
    first = ckdir / "ckpt-00000001.pt"
    before = first.read_bytes()
    deadline = time.monotonic() + 60
    while not list(ckdir.glob(".ckpt-00000002.pt.*.tmp")):  # the second save has started writing
        assert proc.poll() is None and time.monotonic() < deadline, "the save finished before it could be killed"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert first.read_bytes() == before
    assert not (ckdir / "ckpt-00000002.pt").exists()
    assert find_latest(ckdir).step == 1
    with trainscale.init(environ={}, set_threads=False) as rt:  # the next save sweeps the dead temp file
        Checkpointer(ckdir, rt, keep=5).save(3, {"x": torch.zeros(1)})
    assert not list(ckdir.glob(".ckpt-*.tmp"))
