"""Atomic rank-0 checkpoints: complete or absent, private, safe to load, newest good one wins."""

from __future__ import annotations

import os
import stat

import pytest
import torch

import trainscale
from trainscale.checkpoint import Checkpointer, find_latest, list_checkpoints, load_file
from trainscale.errors import CheckpointError


@pytest.fixture
def rt(monkeypatch, tmp_path_factory):
    # torch sets it (and makes the directory) on first use: not inside the directory a test checks is empty
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
    with trainscale.init(environ={}, set_threads=False) as runtime:
        yield runtime


def test_save_and_latest_roundtrip(tmp_path, rt):
    ck = Checkpointer(tmp_path, rt, keep=2)
    for step in (10, 20, 30):
        ck.save(step, {"w": torch.full((3,), float(step)), "step": step})
    assert [s for s, _ in list_checkpoints(tmp_path)] == [30, 20]  # pruned to keep=2
    found = ck.latest()
    assert found.step == 30 and torch.equal(found.contents["w"], torch.full((3,), 30.0))
    meta = found.record
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
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != ".trainscale.lock") == [
        good.name,
        good.name + ".json",
    ]  # no temp or half file
    assert ck.latest().step == 1


def test_corrupt_newest_is_skipped_with_warning(tmp_path, rt, caplog):
    ck = Checkpointer(tmp_path, rt, keep=5)
    ck.save(1, {"x": torch.ones(2)})
    newest = ck.save(2, {"x": torch.ones(2)})
    newest.write_bytes(newest.read_bytes()[:100])  # truncated
    found = find_latest(tmp_path)
    assert found.step == 1
    assert "ckpt-00000002.pt holds 100 bytes, its manifest says" in caplog.text


def test_unreadable_file_says_so_even_when_torch_gives_no_message(tmp_path):
    """An empty EOFError used to become an IndexError while the message was built."""
    from trainscale.checkpoint.files import read_torch_file

    (tmp_path / "empty.pt").write_bytes(b"")
    with pytest.raises(CheckpointError, match=r"is unreadable \(truncated or corrupt\)"):
        read_torch_file(tmp_path / "empty.pt")


def test_malicious_pickle_is_refused_and_never_runs(tmp_path, rt):
    """A .pt whose manifest was re-sealed to match (an attacker can do that) still cannot run code."""
    from helpers.damage import damage

    marker = tmp_path / "pwned"
    path = Checkpointer(tmp_path / "ck", rt).save(1, {"x": torch.ones(1)})
    damage(path, "payload", marker=marker)
    with pytest.raises(CheckpointError, match="was refused: .*posix.system"):
        load_file(path)
    assert not marker.exists()


def test_file_without_completion_record_is_not_complete(tmp_path):
    from trainscale.checkpoint.files import save_file

    path = save_file(tmp_path, 5, {"x": torch.ones(1)}, {"complete": False})
    with pytest.raises(CheckpointError, match="not a complete"):
        load_file(path)


def test_strategy_mismatch_names_the_fix_where_the_strategies_do_not_resume_each_other(tmp_path, rt):
    Checkpointer(tmp_path, rt, strategy="ddp").save(1, {"x": torch.ones(1)})
    for other in ("zero1", "fsdp"):  # strategies/portable.py: these read each other's checkpoints
        assert Checkpointer(tmp_path, rt, strategy=other).latest().step == 1
    with pytest.raises(CheckpointError, match="--strategy ddp"):
        Checkpointer(tmp_path, rt, strategy="deepspeed").latest()


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


# -------------------------------------------------------------------------- the typed interface
def _trained(rt, seed: int):
    torch.manual_seed(seed)
    model, opt = rt.setup(torch.nn.Linear(4, 2), lambda params: torch.optim.Adam(params, lr=0.1))
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    for _ in range(2):
        rt.backward(model(torch.ones(3, 4)).sum(), model)
        opt.step()
        opt.zero_grad()
        scheduler.step()
    return model, opt, scheduler


def test_save_and_restore_typed_entries_in_place(tmp_path, rt):
    """A ModelState (stored the strategy's way), Stateful entries (an LR scheduler, the RNGs) and plain
    values: the same file layout as before, restored in place."""
    from trainscale.checkpoint import RNGState

    model, opt, scheduler = _trained(rt, seed=1)
    ck = Checkpointer(tmp_path, rt, strategy=rt.strategy_of(model))
    ck.save(2, {"model": rt.checkpoint_state(model, opt), "scheduler": scheduler, "rng": RNGState(), "step": 2})
    expected = torch.rand(3)
    on_disk = torch.load(tmp_path / "ckpt-00000002.pt", weights_only=True)
    assert sorted(on_disk) == ["model", "optimizer", "rng", "scheduler", "step", "trainscale"]

    other, other_opt, other_scheduler = _trained(rt, seed=2)
    found = ck.restore(
        {"model": rt.checkpoint_state(other, other_opt), "scheduler": other_scheduler, "rng": RNGState()}
    )
    assert found.step == 2 and found.contents["step"] == 2 and found.record["strategy"] == "ddp"
    assert torch.equal(other.weight, model.weight) and other_scheduler.get_last_lr() == scheduler.get_last_lr()
    assert torch.equal(other_opt.state_dict()["state"][0]["exp_avg"], opt.state_dict()["state"][0]["exp_avg"])
    assert torch.equal(torch.rand(3), expected)  # the RNG is back where it was when saved


def test_restore_without_a_checkpoint_changes_nothing(tmp_path, rt):
    model, opt, _ = _trained(rt, seed=1)
    before = model.weight.detach().clone()
    assert Checkpointer(tmp_path, rt).restore({"model": rt.checkpoint_state(model, opt)}) is None
    assert torch.equal(model.weight, before)


def test_entries_that_clash_with_the_model_state_are_refused(tmp_path, rt):
    model, opt, _ = _trained(rt, seed=1)
    state = rt.checkpoint_state(model, opt)
    with pytest.raises(CheckpointError, match=r"entries \['optimizer'\] are both model state and other state"):
        Checkpointer(tmp_path, rt).save(1, {"model": state, "optimizer": {"lr": 1}})
    with pytest.raises(CheckpointError, match="2 model states in one checkpoint"):
        Checkpointer(tmp_path, rt).save(1, {"a": state, "b": state})
    assert [p.name for p in tmp_path.iterdir()] == [".trainscale.lock"]  # nothing but the run's lock


def test_entries_without_a_model_state_are_a_rank_0_file_whatever_the_strategy(tmp_path, rt):
    """Where state goes is its ModelState's storage; without one (metrics, counters) rank 0 writes a
    file, also under a Checkpointer made for a sharded strategy."""
    from trainscale.strategies import get_strategy

    path = Checkpointer(tmp_path, rt, strategy=get_strategy("fsdp")).save(1, {"x": torch.ones(2), "step": 1})
    assert path.is_file() and path.name == "ckpt-00000001.pt"
    assert torch.equal(find_latest(tmp_path).contents["x"], torch.ones(2))


def test_a_second_run_on_a_checkpoint_directory_is_refused_naming_the_holder_until_it_is_gone(tmp_path, rt):
    """issue 35 item 2: one run per checkpoint directory. Another process's Checkpointer on the directory is
    refused in one line naming its pid and host; once that process is gone — killed, no clean-up — the lock
    is free. The same process may open the directory again (a resume and a save, a second runtime)."""
    import signal
    import socket
    import subprocess
    import sys

    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, trainscale; from trainscale.checkpoint import Checkpointer\n"
                "rt = trainscale.init(environ={'TRAINSCALE_RUN_DIR': '/runs/first'}, set_threads=False)\n"
                f"c = Checkpointer({str(tmp_path)!r}, rt)\nc.save(1, {{'step': 1}})\nprint('held', flush=True)\n"
                "sys.stdin.read()"
            ),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CheckpointError) as refused:
            Checkpointer(tmp_path, rt).save(1, {"step": 1})  # the first save (or resume) takes the lock
        text = str(refused.value)
        assert (
            f"checkpoint directory {tmp_path} is in use by another run (pid {holder.pid} on "
            f"{socket.gethostname()}, run directory /runs/first, since " in text
        ), text
        assert "give this one another --checkpoint-dir" in text
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    first = Checkpointer(tmp_path, rt)  # the holder died without a word: its lock went with it
    assert first.restore({}).step == 1
    second = Checkpointer(tmp_path, rt)  # this process again: shared
    second.save(2, {"step": 2})
    second.close()
    first.save(3, {"step": 3})
    first.close()


def test_deepspeed_files_that_cannot_be_converted_are_one_named_error(tmp_path, monkeypatch):
    """strategies/portable.py reads DeepSpeed's ZeRO files for ddp, zero1 and fsdp (with DeepSpeed's zero_to_fp32
    helpers, stubbed here): files it cannot convert (a model-state file without DeepSpeed's records) and a
    machine without DeepSpeed are CheckpointErrors naming the way out, not tracebacks."""
    import sys
    import types

    from trainscale.strategies.portable import from_deepspeed

    helpers = types.ModuleType("deepspeed.utils.zero_to_fp32")
    helpers.get_model_state_files = lambda directory: [f"{directory}/mp_rank_00_model_states.pt"]
    torch.save({"module": {}}, tmp_path / "mp_rank_00_model_states.pt")  # without DeepSpeed's records
    utils = types.ModuleType("deepspeed.utils")
    utils.zero_to_fp32 = helpers
    monkeypatch.setitem(sys.modules, "deepspeed", types.ModuleType("deepspeed"))
    monkeypatch.setitem(sys.modules, "deepspeed.utils", utils)
    with pytest.raises(CheckpointError, match="holds DeepSpeed files trainscale cannot convert") as got:
        from_deepspeed(tmp_path)
    assert "--strategy deepspeed" in got.value.hint
    monkeypatch.setitem(sys.modules, "deepspeed.utils", None)  # import fails as where DeepSpeed is not installed
    with pytest.raises(CheckpointError, match="which need DeepSpeed installed to read"):
        from_deepspeed(tmp_path)
