"""`trainscale report` end to end: 2 real gloo ranks record their steps (rank 1's loader is slow), the
node's sampler and rank 0's straggler watch run beside them, the report names the straggler and its
cause, and headless Chromium (Debian's) opens the page from disk with no network: every plot loads,
no script error, and a screenshot is written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

import pytest
from helpers.browser import check_page, chromium, screenshot  # noqa: F401  (chromium: a fixture)
from helpers.cli import in_process

SCRIPT = textwrap.dedent("""
    import os, time
    import torch
    import trainscale
    from trainscale.observe.flops import count_step_flops, mfu, peak_for
    from trainscale.observe.records import RankRecorder
    from trainscale.observe.sampler import start_sampler
    from trainscale.observe.stragglers import StragglerWatch

    run_dir = os.environ["TRAINSCALE_RUN_DIR"]
    with trainscale.init(device="cpu", seed=0) as rt:
        rec = RankRecorder(run_dir, rt.rank, flush_every=10, flush_after_s=0.5, world_size=rt.world_size)
        sampler = start_sampler(run_dir, local_rank=rt.local_rank)
        watch = StragglerWatch(run_dir, say=print, every_s=0.3, window=15).start() if rt.is_main else None
        model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(256, 256))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(32, 256)
        flops = count_step_flops(lambda: model.module(x).sum().backward())
        for step in range(60):
            t0 = time.perf_counter()
            time.sleep(0.03 if rt.rank == 1 else 0.002)  # this rank's data loader is the slow one
            t1 = time.perf_counter()
            loss = model(x).pow(2).mean()
            t_forward = time.perf_counter()  # this rank's own work; backward waits in DDP's all-reduce
            opt.zero_grad()
            loss.backward()
            opt.step()
            t2 = time.perf_counter()
            rec.step(step, t2 - t0, data_s=t1 - t0, compute_s=t_forward - t1, comm_s=t2 - t_forward, samples=32)
        if watch is not None:
            watch.check()
            watch.stop()
        if sampler is not None:
            sampler.sample()
            sampler.stop()
        peak = peak_for(rt.device, torch.float32)
        rec.summary(mfu=mfu(flops, t2 - t0, peak.flops), flops_per_step=flops, peak_flops=peak.flops)
        rec.close()
""")


@pytest.mark.slow
def test_report_names_the_straggler_and_renders_in_a_browser(tmp_path, chromium, capsys):
    script = tmp_path / "observed.py"
    script.write_text(SCRIPT)
    run_dir = tmp_path / "run"
    env = {
        **os.environ,
        "TRAINSCALE_RUN_DIR": str(run_dir),
        "TRAINSCALE_SAMPLE_INTERVAL": "0.2",
        "OMP_NUM_THREADS": "1",
        # the script keeps its own records and watch: the automatic recorder would write the same rank files and
        # publish its own windows under the same ranks in the group's store, which the script's watch then reads
        "TRAINSCALE_RECORD": "0",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainscale",
            "run",
            "--nproc-per-node",
            "2",
            "--log-dir",
            str(tmp_path / "logs"),
            str(script),
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    named = r"straggler: rank 1 on \S+ arrives last at the collectives, [\d.]+ ms after the others each step: "
    assert re.search(r"trainscale: " + named + "host work between steps", done.stdout), done.stdout

    report = subprocess.run(
        [sys.executable, "-m", "trainscale", "report", str(run_dir)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0, report.stderr
    assert re.search(r"\[problem\] " + named + "host work between steps", report.stdout), report.stdout
    assert "model FLOPs utilisation" in report.stdout
    page = run_dir / "report" / "report.html"
    assert page.exists() and (run_dir / "report" / "step-time.png").exists()

    assert check_page(chromium, page, tmp_path / "chrome") >= 3  # step time, time shares, utilisation over time
    screenshot(chromium, page, tmp_path / "chrome", run_dir / "report" / "screenshot.png", capsys, "the report page")


@pytest.mark.slow
def test_the_training_loop_records_itself_unless_told_not_to(tmp_path):
    import json

    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from trainscale.workloads.cnn import CNN

    argv = ["run", "--nproc-per-node", "2", "--workload", "cnn", "--epochs", "1", "--log-every", "0"]
    done = in_process(*argv[:3], "--log-dir", str(tmp_path / "logs"), *argv[3:], cwd=tmp_path, drop=("TRAINSCALE_",))
    assert done.returncode == 0, done.stderr
    (run_dir,) = [
        d for d in (tmp_path / "logs").iterdir() if (d / "metrics").is_dir() and not d.is_symlink()
    ]  # beside torch's log dir
    metrics = run_dir / "metrics"
    ranks = {r: [json.loads(line) for line in (metrics / f"rank-{r}.jsonl").read_text().splitlines()] for r in (0, 1)}
    for rank, records in ranks.items():
        meta, steps = records[0], [r for r in records if r["kind"] == "step"]
        assert (meta["kind"], meta["rank"], meta["workload"], meta["strategy"]) == ("meta", rank, "cnn", "ddp")
        assert [s["step"] for s in steps] == list(range(1, len(steps) + 1)) and len(steps) > 20
        for s in steps:
            phases = s["data_s"] + s["compute_s"] + s["backward_s"] + s["comm_s"] + s["optimizer_s"]
            assert s["samples"] == 16 and 0 < phases <= s["step_s"] * 1.0001
        # the exposed all-reduce: DDP's end-of-backward wait for it, timed by the one clock of a step
        assert sum(s["comm_s"] for s in steps) > 0
        summary = records[-1]
        assert summary["kind"] == "summary" and summary["steps_recorded"] == len(steps)
        assert 0 < summary["mfu"] < 1 and summary["peak_mem_bytes"] > 0
    # a step's FLOPs: three times the forward's (backward is twice the forward for convolutions and matmuls)
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        CNN()(torch.zeros(16, 1, 28, 28))
    assert ranks[0][-1]["flops_per_step"] == 3 * counter.get_total_flops()
    assert list(metrics.glob("node-*.jsonl")), "local rank 0 samples its node"

    report = subprocess.run(
        [sys.executable, "-m", "trainscale", "report", str(run_dir), "--text"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert report.returncode == 0 and re.search(r"^1\s+\S+\s+\d+", report.stdout, re.M), report.stdout
    assert "backward  optimizer  comm" in report.stdout

    quiet = in_process(
        *argv[:3],
        "--log-dir",
        str(tmp_path / "quiet"),
        *argv[3:],
        "--max-steps",
        "5",
        cwd=tmp_path,
        env={"TRAINSCALE_RECORD": "0"},
        drop=("TRAINSCALE_",),
    )
    assert quiet.returncode == 0, quiet.stderr
    assert not list((tmp_path / "quiet").glob("*/metrics"))
