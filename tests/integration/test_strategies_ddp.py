"""DDP's overlap and communication hooks on 2 real gloo ranks: what changes the result and what must not.

- Buckets (overlap) change only when each all-reduce starts; with two ranks the all-reduce adds the same
  two gradients whatever the layout, so the parameters after K Adam steps are bitwise those of one bucket.
- fp16/bf16 compression rounds each averaged gradient to half precision: after K SGD steps (lr 0.5) the
  parameters are within 2e-3 (fp16, 11 bits of mantissa) and 2e-2 (bf16, 8 bits) of the uncompressed
  run, relative to the largest value of each tensor, and not equal to it.
- PowerSGD (rank 1) changes the gradients once it starts (here at step 2 of 4).
- The recorder (the one clock of a step) changes nothing: the same result with and without it, and with
  every hook its step records hold the exposed all-reduce.
"""

from __future__ import annotations

import pytest
import torch
from helpers.multiproc import run_on_ranks
from integration.test_run_cli import FAST_CNN, trainscale
from torch import nn

STEPS, BATCH, WIDTH = 4, 8, 512


def model() -> nn.Module:
    """4 MiB of gradients in four equal layers: the auto rule (1 MiB buckets) makes several buckets."""
    torch.manual_seed(3)
    layers: list[nn.Module] = []
    for _ in range(4):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()]
    return nn.Sequential(*layers, nn.Linear(WIDTH, 4))


def train(rt, spec: str, sgd: bool, timed: bool) -> tuple[dict[str, torch.Tensor], dict | None, str | None]:
    import os
    import tempfile

    from trainscale.observe.hooks import Recorder
    from trainscale.observe.reading import ranks
    from trainscale.strategies import comm_hooks, get_strategy
    from trainscale.strategies.base import OptimizerSpec

    strategy = get_strategy(spec).with_batch(BATCH, 1)  # as the training loop: static_graph=auto is on
    optimizer = OptimizerSpec(torch.optim.SGD, {"lr": 0.5}) if sgd else OptimizerSpec(torch.optim.Adam, {"lr": 1e-2})
    net, opt = strategy.wrap(model(), optimizer, rt)
    with tempfile.TemporaryDirectory() as run_dir:
        recorder = (
            Recorder(
                run_dir, environ={**os.environ, "TRAINSCALE_SAMPLE_INTERVAL": "0", "TRAINSCALE_STRAGGLER_EVERY": "0"}
            ).install()
            if timed
            else None
        )
        g = torch.Generator().manual_seed(rt.rank)
        for _ in range(STEPS):
            x, y = torch.randn(BATCH, WIDTH, generator=g), torch.randint(0, 4, (BATCH,), generator=g)
            strategy.backward_loss(nn.functional.cross_entropy(net(x), y), net)
            strategy.micro_step(opt, net, last=True)
        if recorder is not None:
            recorder.finish()
        shares = next((s.shares for s in ranks(run_dir) if s.rank == rt.rank), None)
    hook = comm_hooks.attached(net)
    params = {k: v.detach().clone() for k, v in strategy.unwrap(net).state_dict().items()}
    return params, shares, hook.name if hook else None


def runs() -> dict:
    import trainscale

    # comm_hook=none: DDP's own all-reduce (auto would average these CPU ranks through shared memory,
    # test_shm_allreduce.py), whose overlap with backward is what the bucket cases are about
    cases = {
        "one-bucket": ("ddp:bucket_cap_mb=25,comm_hook=none", False, False),
        "auto": ("ddp:comm_hook=none", False, False),
        "auto-timed": ("ddp:comm_hook=none", False, True),
        "sgd": ("ddp:comm_hook=none", True, False),
        "fp16": ("ddp:comm_hook=fp16", True, False),
        "bf16": ("ddp:comm_hook=bf16", True, False),
        "bf16-timed": ("ddp:comm_hook=bf16", True, True),
        "zero1-bf16": ("zero1:comm_hook=bf16", True, False),
        "powersgd": ("ddp:comm_hook=powersgd,powersgd_start=2", True, True),
    }
    with trainscale.init(seed=0) as rt:
        return {name: train(rt, *case) for name, case in cases.items()}


def _max_rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max() / a[k].abs().max()) for k in a)


def test_overlap_and_hooks_on_two_ranks():
    results = run_on_ranks(runs, 2, timeout=300)
    r0, r1 = results[0], results[1]
    params = {name: r[0] for name, r in r0.items()}
    for name in params:  # every rank holds the same replica
        assert all(torch.equal(params[name][k], r1[name][0][k]) for k in params[name]), name
    assert any(not torch.equal(params["auto"][k], model().state_dict()[k]) for k in params["auto"])
    # overlap changes when the all-reduces start, not what they add up
    assert all(torch.equal(params["one-bucket"][k], params["auto"][k]) for k in params["auto"])
    assert all(torch.equal(params["auto"][k], params["auto-timed"][k]) for k in params["auto"])
    for name, tolerance in (("fp16", 2e-3), ("bf16", 2e-2), ("zero1-bf16", 2e-2)):
        error = _max_rel(params["sgd"], params[name])
        print(f"{name}: max relative difference from uncompressed {error:.2e}")
        assert 0 < error <= tolerance, name  # > 0: the compression ran
    assert all(torch.equal(params["bf16"][k], params["bf16-timed"][k]) for k in params["bf16"])  # recorded, unchanged
    assert all(torch.equal(params["bf16"][k], params["zero1-bf16"][k]) for k in params["bf16"])
    assert _max_rel(params["sgd"], params["powersgd"]) > 1e-3  # low-rank gradients from step 2 on
    assert all(torch.isfinite(v).all() for v in params["powersgd"].values())

    assert [r0[n][2] for n in ("auto", "auto-timed", "bf16", "bf16-timed", "powersgd")] == [
        None,
        None,
        "bf16",
        "bf16",
        "powersgd",
    ]  # the recorder registers no hook of its own
    for name in ("auto-timed", "bf16-timed", "powersgd"):  # the exposed all-reduce, whichever hook ran it
        assert r0[name][1]["comm"] > 0 and r0[name][1]["backward"] > 0, name
    assert r0["auto"][1] is None  # nothing recorded without a recorder


@pytest.mark.slow
def test_cnn_from_the_cli_overlaps_its_two_buckets_with_a_chosen_hook(tmp_path):
    proc = trainscale(
        "run",
        "--nproc-per-node",
        "2",
        "--log-dir",
        "logs",
        "--workload",
        "cnn",
        "--epochs",
        "1",
        *FAST_CNN,
        "--breakdown",
        "--strategy",
        "ddp:comm_hook=bf16",
        "--metrics-out",
        "m.json",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    import json
    import re

    from trainscale.observe.reading import ranks, sections

    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["options"]["strategy"] == "ddp:comm_hook=bf16" and "breakdown" not in metrics["epochs"][-1]
    (run_dir,) = [d for d in (tmp_path / "logs").iterdir() if (d / "metrics").is_dir() and not d.is_symlink()]
    b = sections(ranks(run_dir))  # the records hold the run's timing
    assert b["communication"] > 0 and b["compute"] > 0
    # --breakdown: rank 0's steady step, from its own records
    said = re.search(
        r"Step breakdown \(rank 0, median step ([\d.]+) ms\): data [\d.]+ ms, forward [\d.]+ ms, "
        r"backward [\d.]+ ms, communication exposed ([\d.]+) ms",
        proc.stdout + proc.stderr,
    )
    assert said and float(said.group(1)) > 0 and float(said.group(2)) > 0, proc.stdout[-2000:]


def test_bad_ddp_options_are_refused_before_any_rank_starts(tmp_path):
    cases = [
        (["--strategy", "ddp:comm_hook=fp61"], "is not a communication hook"),
        (["--strategy", "ddp:static_graph=true", "--grad-accum", "2"], "static_graph=true with --grad-accum 2"),
        (["--num-workers", "2"], "--num-workers 2 with --loader tensor"),
        (["--threads", "0"], "--threads 0 must be >= 1"),
        (["--compile", "--strategy", "deepspeed"], "--compile with --strategy deepspeed"),
    ]
    for args, message in cases:
        proc = trainscale(
            "run",
            "--nproc-per-node",
            "2",
            "--log-dir",
            "logs",
            "--workload",
            "cnn",
            *FAST_CNN,
            "--max-steps",
            "1",
            *args,
            cwd=tmp_path,
        )
        assert proc.returncode != 0 and message in proc.stderr, (args, proc.stderr[-2000:])
        assert not (tmp_path / "logs").exists(), args  # refused before launch: no rank ran


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_compiled_cnn_trains_on_two_ranks_and_its_checkpoint_resumes_uncompiled(tmp_path):
    """--compile compiles the DDP-wrapped model (dynamo splits the graph at DDP's buckets), and the
    checkpoint holds the plain module's keys, so a run without --compile resumes it."""
    import json

    common = [
        "run",
        "--nproc-per-node",
        "2",
        "--log-dir",
        "logs",
        "--workload",
        "cnn",
        "--epochs",
        "1",
        *FAST_CNN,
        "--breakdown",
        "--checkpoint-dir",
        "ckpt",
        "--checkpoint-every",
        "2",
        "--metrics-out",
        "m.json",
    ]
    first = trainscale(*common, "--compile", "--max-steps", "4", cwd=tmp_path)
    assert first.returncode == 0, first.stderr[-3000:]
    metrics = json.loads((tmp_path / "m.json").read_text())
    assert metrics["options"]["compile"] is True
    second = trainscale(*common, "--max-steps", "6", cwd=tmp_path)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "Resumed from ckpt/ckpt-00000004.pt at step 4" in second.stdout + second.stderr
