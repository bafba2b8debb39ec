"""Sharded (DCP) checkpoints through the same Checkpointer.save/.latest as DDP's rank-0 files:
saved by 2 ranks, resumed by 1 and by 4 with every parameter and optimizer value restored exactly;
an interrupted save (a rank failing mid-write, a missing marker, a missing .metadata) is never
taken for a complete one. ZeRO-1's consolidated rank-0 file reshards the same way.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from helpers.multiproc import run_on_ranks
from integration.test_strategies import batches, mlp
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map

SAVED_STEP = 4


def _adam():
    from trainscale.strategies.base import OptimizerSpec

    return OptimizerSpec(torch.optim.Adam, {"lr": 1e-2})


def _full_state(strategy, model, opt) -> dict:
    """Model and optimizer state as plain CPU tensors keyed by parameter name (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    if strategy.name == "zero1":
        return {
            "model": {k: v.clone() for k, v in strategy.unwrap(model).state_dict().items()},
            "optimizer": strategy.checkpoint_state(model, opt).state_dict()["optimizer"],
        }
    # fsdp: gathered on every rank (cpu_offload=False keeps every rank's copy) and compared on rank 0
    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True))
    return {"model": msd, "optimizer": osd}


def save_two_ranks(root: str) -> dict:
    import trainscale
    from trainscale.checkpoint import Checkpointer
    from trainscale.strategies import get_strategy

    out = {}
    with trainscale.init(seed=0) as rt:
        for name in ("fsdp", "zero1"):
            strategy = get_strategy(name)
            model, opt = strategy.wrap(mlp(), _adam(), rt)
            ckpt = Checkpointer(Path(root) / name, rt, strategy=strategy)
            for step, (x, y) in enumerate(batches(rt.rank, rt.world_size), start=1):
                strategy.backward_loss(nn.functional.cross_entropy(model(x), y), model)
                strategy.micro_step(opt, model, last=True)
                if step in (2, SAVED_STEP):
                    ckpt.save(step, {"model": strategy.checkpoint_state(model, opt), "step": step, "note": "kept"})
            out[name] = _full_state(strategy, model, opt)
    return out


def resume(root: str) -> dict:
    import trainscale
    from trainscale.checkpoint import Checkpointer
    from trainscale.strategies import get_strategy

    out = {}
    with trainscale.init(seed=0) as rt:
        for name in ("fsdp", "zero1"):
            strategy = get_strategy(name)
            model = mlp()
            torch.manual_seed(123)  # other initial weights: everything must come from the checkpoint
            with torch.no_grad():
                for p in model.parameters():
                    p.normal_()
            model, opt = strategy.wrap(model, _adam(), rt)
            found = Checkpointer(Path(root) / name, rt, strategy=strategy).restore(
                {"model": strategy.checkpoint_state(model, opt)}
            )
            out[name] = {
                "step": found.step,
                "extra": (found.contents["step"], found.contents["note"]),
                "written_by": found.record["world_size"],
                **_full_state(strategy, model, opt),
            }
    return out


def _assert_same_tree(a, b, what: str) -> None:
    flat_a, spec_a = tree_flatten(a)
    flat_b, spec_b = tree_flatten(b)
    assert spec_a == spec_b, f"{what}: different structure"
    assert flat_a, what
    for x, y in zip(flat_a, flat_b):
        if torch.is_tensor(x):
            assert torch.equal(x, y), f"{what}: a value differs"
        else:
            assert x == y, f"{what}: {x!r} != {y!r}"


@pytest.mark.slow
def test_save_on_2_resume_on_1_and_4_ranks_exactly(tmp_path):
    saved = run_on_ranks(save_two_ranks, 2, str(tmp_path))[0]
    listing = sorted(p.name for p in (tmp_path / "fsdp").iterdir())
    assert listing == [".trainscale.lock", "ckpt-00000002", "ckpt-00000004"], listing  # keep=2, no partial dirs left
    assert json.loads((tmp_path / "fsdp" / "ckpt-00000004" / "trainscale.json").read_text())["format"] == "dcp"
    # training state is the user's alone: the directory and every file in it
    import stat

    newest = tmp_path / "fsdp" / "ckpt-00000004"
    assert stat.S_IMODE(newest.stat().st_mode) == 0o700
    assert {stat.S_IMODE(f.stat().st_mode) for f in newest.iterdir()} == {0o600}
    assert sorted(p.name for p in (tmp_path / "zero1").iterdir()) == [
        ".trainscale.lock",
        "ckpt-00000002.pt",
        "ckpt-00000002.pt.json",
        "ckpt-00000004.pt",
        "ckpt-00000004.pt.json",
    ]
    assert saved["fsdp"]["optimizer"]["state"], "optimizer state was saved"
    for world in (1, 4):
        resumed = run_on_ranks(resume, world, str(tmp_path))[0]
        for name in ("fsdp", "zero1"):
            got = resumed[name]
            assert got["step"] == SAVED_STEP and got["extra"] == (SAVED_STEP, "kept") and got["written_by"] == 2
            _assert_same_tree(saved[name]["model"], got["model"], f"{name} model 2->{world}")
            _assert_same_tree(saved[name]["optimizer"], got["optimizer"], f"{name} optimizer 2->{world}")


def failing_save(root: str) -> dict:
    """Save step 2, then a save of step 4 during which rank 1's shard write fails."""
    from torch.distributed.checkpoint import FileSystemWriter

    import trainscale
    from trainscale.checkpoint import Checkpointer
    from trainscale.errors import CheckpointError
    from trainscale.strategies import get_strategy

    with trainscale.init(seed=0) as rt:
        strategy = get_strategy("fsdp")
        model, opt = strategy.wrap(mlp(), _adam(), rt)
        ckpt = Checkpointer(root, rt, strategy=strategy)
        ckpt.save(2, {"model": strategy.checkpoint_state(model, opt), "step": 2})
        if rt.rank == 1:

            def broken(self, plan, planner):
                raise OSError("disk full (injected)")

            FileSystemWriter.write_data = broken
        error = None
        try:
            ckpt.save(4, {"model": strategy.checkpoint_state(model, opt), "step": 4})
        except CheckpointError as exc:  # DCP reports one rank's failure on every rank
            error = str(exc)
        rt.barrier()
        found = ckpt.latest()
        return {"error": error, "latest": found.step}


@pytest.mark.slow
def test_interrupted_sharded_save_is_skipped(tmp_path, caplog):
    results = run_on_ranks(failing_save, 2, str(tmp_path))
    assert all("rank 1: OSError: disk full (injected)" in (r["error"] or "") for r in results.values()), results
    assert all(r["latest"] == 2 for r in results.values()), results
    assert not (tmp_path / "ckpt-00000004").exists()
    assert not (tmp_path / ".ckpt-00000004.partial").exists()  # the failed save left nothing half-written

    from trainscale.checkpoint import find_latest

    good = tmp_path / "ckpt-00000002"
    no_marker, no_metadata = tmp_path / "ckpt-00000006", tmp_path / "ckpt-00000008"
    shutil.copytree(good, no_marker)
    (no_marker / "trainscale.json").unlink()  # killed before rank 0 wrote the marker
    shutil.copytree(good, no_metadata)
    (no_metadata / ".metadata").unlink()  # shards without DCP's index
    with caplog.at_level("WARNING", logger="trainscale.checkpoint"):
        found = find_latest(tmp_path)
    assert found is not None and found.step == 2 and found.path == good
    assert "interrupted" in caplog.text and ".metadata" in caplog.text


SHARDED_SAVER = """
import sys, torch, trainscale
from trainscale.checkpoint import Checkpointer, ModelState
from trainscale.checkpoint.state import DCP
from trainscale.strategies import get_strategy
from trainscale.strategies.base import OptimizerSpec

class Big(ModelState):  # 256 MB of shards: slow enough to be killed midway
    storage = DCP
    def state_dict(self):
        return {"model": {"w": torch.randn(64, 1024, 1024)}}
    def load_state_dict(self, state_dict):
        pass

with trainscale.init(environ={}, set_threads=False) as rt:
    strategy = get_strategy("fsdp")
    model, opt = strategy.wrap(torch.nn.Linear(4, 4), OptimizerSpec(torch.optim.SGD, {"lr": 0.1}), rt)
    ckpt = Checkpointer(sys.argv[1], rt, strategy=strategy, keep=5)
    ckpt.save(1, {"model": strategy.checkpoint_state(model, opt), "step": 1})
    print("first saved", flush=True)
    ckpt.save(2, {"model": Big(), "step": 2})
"""


def test_sigkill_during_a_sharded_save_leaves_the_previous_checkpoint(tmp_path):
    import signal
    import subprocess
    import sys
    import time

    from trainscale.checkpoint import find_latest

    script = tmp_path / "saver.py"
    script.write_text(SHARDED_SAVER)
    root = tmp_path / "ck"
    proc = subprocess.Popen([sys.executable, str(script), str(root)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "first saved"
    first = root / "ckpt-00000001"
    before = {p.name: p.read_bytes() for p in first.iterdir()}
    partial = root / ".ckpt-00000002.partial"
    deadline = time.monotonic() + 60
    while not (partial.is_dir() and any(partial.iterdir())):  # shards are being written
        assert proc.poll() is None and time.monotonic() < deadline, "the save finished before it could be killed"
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert {p.name: p.read_bytes() for p in first.iterdir()} == before
    assert not (root / "ckpt-00000002").exists()
    found = find_latest(root)
    assert found is not None and found.step == 1


# Damages that one rank alone finds (each small shard is one piece, hashed by one rank), that every rank finds
# (a payload in DCP's index, which every rank reads) and a rank-0 file's.
DAMAGED = {
    "fsdp": [
        ("truncate", "__0_0.distcp"),
        ("truncate", "__1_0.distcp"),
        ("flip", "__1_0.distcp"),
        ("delete", "__1_0.distcp"),
        ("payload", ".metadata"),
    ],
    "zero1": [("flip", None), ("zero", None), ("payload", None)],
}


def resume_past_damage(root: str, read_only: str | None) -> dict:
    """Save steps 2 and 4, then for each damage of step 4 (in a copy): resume, on every rank."""
    import logging

    from helpers.damage import damage

    import trainscale
    from trainscale.checkpoint import Checkpointer
    from trainscale.errors import CheckpointError
    from trainscale.strategies import get_strategy

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logging.getLogger("trainscale.checkpoint").addHandler(handler)
    out: dict = {"cases": []}
    with trainscale.init(seed=0) as rt:
        for name, cases in DAMAGED.items():
            strategy = get_strategy(name)
            model, opt = strategy.wrap(mlp(), _adam(), rt)
            good = Path(root) / name / "good"
            ckpt = Checkpointer(good, rt, strategy=strategy, keep=5)
            for step, (x, y) in enumerate(batches(rt.rank, rt.world_size), start=1):
                strategy.backward_loss(nn.functional.cross_entropy(model(x), y), model)
                strategy.micro_step(opt, model, last=True)
                if step in (2, SAVED_STEP):
                    ckpt.save(step, {"model": strategy.checkpoint_state(model, opt), "step": step})
                if step == 2:  # copies: a consolidated optimizer state may share the live tensors
                    saved = tree_map(
                        lambda v: v.clone() if torch.is_tensor(v) else v, _full_state(strategy, model, opt)
                    )
            for i, (kind, target) in enumerate(cases):
                case = Path(root) / name / f"case{i}"
                if rt.is_main:
                    shutil.copytree(good, case)
                    newest = case / ("ckpt-00000004" if name == "fsdp" else "ckpt-00000004.pt")
                    damage(newest, kind, target=target, marker=Path(root) / "pwned")
                rt.barrier()
                before = len(records)
                found = Checkpointer(case, rt, strategy=strategy).restore(
                    {"model": strategy.checkpoint_state(model, opt)}
                )
                try:
                    _assert_same_tree(saved, _full_state(strategy, model, opt), f"{name} {kind}")
                    same = True
                except AssertionError as exc:
                    same = str(exc)
                out["cases"].append(
                    {
                        "name": name,
                        "kind": kind,
                        "target": target,
                        "step": found.step,
                        "same": same,
                        "warnings": [r.getMessage() for r in records[before:]],
                    }
                )
        if read_only:
            try:
                Checkpointer(read_only, rt)  # a rank-0 file: rank 0 alone writes, every rank agrees
            except CheckpointError as exc:
                out["read_only"] = exc.message
    return out


@pytest.mark.slow
def test_every_rank_skips_a_newest_checkpoint_that_any_rank_finds_damaged(tmp_path):
    """Each rank hashes its share of a sharded checkpoint; they agree (an all-gather) before any
    loads, so a shard only rank 1 checks still sends both ranks back to step 2, with one warning
    (rank 0's) naming the file. Before, the truncated shard made every restart fail and the
    crafted .metadata ran its payload. A read-only --checkpoint-dir is refused on every rank."""
    import subprocess

    read_only = tmp_path / "read-only"
    read_only.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(read_only)]).returncode == 0
    try:
        results = run_on_ranks(resume_past_damage, 2, str(tmp_path), str(read_only) if mounted else None, timeout=600)
    finally:
        if mounted:
            subprocess.run(["umount", str(read_only)], check=True)
    for rank, out in results.items():
        assert len(out["cases"]) == sum(map(len, DAMAGED.values()))
        for case in out["cases"]:
            assert case["step"] == 2 and case["same"] is True, (rank, case)
            if rank == 0:
                named = case["target"] or "ckpt-00000004.pt"
                assert len(case["warnings"]) == 1 and named in case["warnings"][0], case
            else:
                assert case["warnings"] == [], case
    assert not (tmp_path / "pwned").exists()
    if mounted:
        assert "is unusable: no file can be created" in results[0]["read_only"]
        assert "is unusable on rank(s) 0" in results[1]["read_only"]
