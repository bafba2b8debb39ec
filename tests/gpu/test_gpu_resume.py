"""Resume on GPUs (docs/gpu.md): bitwise with deterministic mode; without it within 1e-5 (max |Δ| / max |p|)
with plain SGD. The GPU's RNG state travels with the checkpoint, also to a run that sees fewer GPUs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from helpers.gpu import trainscale
from helpers.multiproc import run_on_ranks

CNN = [
    "--workload",
    "cnn",
    "--data",
    "synthetic",
    "--samples",
    "1024",
    "--batch-size",
    "32",
    "--log-every",
    "0",
    "--loader",
    "tensor",
]


def _weights(directory: Path) -> dict[str, torch.Tensor]:
    return torch.load(sorted(directory.glob("ckpt-*.pt"))[-1], weights_only=True)["model"]


def test_cnn_resumed_after_an_epoch_matches_the_uninterrupted_run_bitwise(gpus, tmp_path):
    """With --deterministic (real convolutions, Adam): bitwise. Without it there is no small bound for
    Adam (docs/gpu.md); the plain-SGD promise is checked by the selftest's resume check below."""
    gpus.need(2)
    common = ["run", "--nproc-per-node", "2", "--log-dir", "logs", *CNN, "--device", gpus.device, "--deterministic"]
    whole = trainscale(tmp_path, *common, "--epochs", "2", "--checkpoint-dir", "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    first = trainscale(tmp_path, *common, "--epochs", "1", "--checkpoint-dir", "parts")
    assert first.returncode == 0, first.stderr[-3000:]
    second = trainscale(tmp_path, *common, "--epochs", "2", "--checkpoint-dir", "parts")
    assert second.returncode == 0 and "Resumed from" in second.stdout, second.stderr[-3000:]
    a, b = _weights(tmp_path / "whole"), _weights(tmp_path / "parts")
    assert all(torch.equal(a[k], b[k]) for k in a), "deterministic resume must be bitwise"


def save_half(device: str, root: str) -> dict:
    """K steps with dropout and a checkpoint (all GPUs visible), then K more: the uninterrupted run."""
    import trainscale as ts
    from trainscale.checkpoint import Checkpointer
    from trainscale.runtime.seed import rng_state
    from trainscale.selftest.checks import STEPS, batch, mlp, params
    from trainscale.strategies import get_strategy

    with ts.init(device=device, timeout_s=120, deterministic=device == "cuda") as rt:
        strategy = get_strategy("ddp")
        model, opt = strategy.wrap(mlp(dropout=0.2), lambda p: torch.optim.SGD(p, lr=0.05), rt)
        ckpt = Checkpointer(root, rt, strategy=strategy)
        for i in range(2 * STEPS):
            x, y = batch(i, rt)
            strategy.backward_loss(torch.nn.functional.cross_entropy(model(x), y), model)
            strategy.micro_step(opt, model, last=True)
            if i + 1 == STEPS:
                ckpt.save(
                    STEPS, {"model": strategy.checkpoint_state(model, opt), "step": STEPS, "rng": rng_state(rt.device)}
                )
        return {"params": params(model), "device": str(rt.device)}


def resume_half(device: str, root: str) -> dict:
    import trainscale as ts
    from trainscale.checkpoint import Checkpointer
    from trainscale.runtime.seed import set_rng_state
    from trainscale.selftest.checks import STEPS, batch, mlp, params
    from trainscale.strategies import get_strategy
    from trainscale.strategies.ddp import rebuild_buckets

    with ts.init(device=device, timeout_s=120, deterministic=device == "cuda") as rt:
        strategy = get_strategy("ddp")
        model, opt = strategy.wrap(mlp(dropout=0.2), lambda p: torch.optim.SGD(p, lr=0.05), rt)
        found = Checkpointer(root, rt, strategy=strategy).restore({"model": strategy.checkpoint_state(model, opt)})
        set_rng_state(found.contents["rng"], rt.device)
        x, y = batch(0, rt)
        rebuild_buckets(model, lambda: torch.nn.functional.cross_entropy(model(x), y).backward(), rt.device)
        for i in range(STEPS, 2 * STEPS):
            x, y = batch(i, rt)
            strategy.backward_loss(torch.nn.functional.cross_entropy(model(x), y), model)
            strategy.micro_step(opt, model, last=True)
        return {"params": params(model), "device": str(rt.device)}


def test_dropout_resume_on_fewer_visible_gpus_is_bitwise(gpus, tmp_path):
    """Defects 3 and 13: saved with every GPU visible, resumed with one GPU per rank (cuda:0 each):
    restoring each GPU's own RNG state (not a list of all of them) makes dropout continue exactly."""
    gpus.need(2)
    whole = run_on_ranks(save_half, 2, gpus.device, str(tmp_path / "ck"), timeout=300)
    one_each = None if gpus.on_cpu else {r: {"CUDA_VISIBLE_DEVICES": str(r)} for r in range(2)}
    resumed = run_on_ranks(resume_half, 2, gpus.device, str(tmp_path / "ck"), rank_env=one_each, timeout=300)
    if not gpus.on_cpu:
        assert [resumed[r]["device"] for r in range(2)] == ["cuda:0", "cuda:0"]
    a, b = whole[0]["params"], resumed[0]["params"]
    assert all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("deterministic", [True, False])
def test_the_selftest_resume_check(gpus, tmp_path, deterministic):
    """trainscale selftest's own resume check (bitwise with deterministic mode, else within 1e-5)."""
    gpus.need(2)
    argv = [
        "selftest",
        "--nproc",
        "2",
        "--device",
        gpus.device,
        "--skip",
        "all-reduce,equivalence,strategies,breakdown,binding,hang",
        "--out",
        "st",
    ] + ([] if deterministic else ["--nondeterministic"])
    done = trainscale(tmp_path, *argv)
    report = json.loads((tmp_path / "st" / "selftest.json").read_text())
    rows = {c["name"]: c for c in report["checks"]}
    assert done.returncode == 0 and rows["resume"]["status"] == "pass", rows["resume"]
