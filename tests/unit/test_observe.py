"""Observability pieces on their own: records, FLOPs and MFU, device sampling, stragglers, the network
transport NCCL chose (log fixtures), SLURM accounting."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from trainscale.observe.flops import PEAKS, count_step_flops, cpu_probe, device_key, mfu, peak_for, tf32_in_use
from trainscale.observe.interconnect import arm, judge, parse_nccl_log
from trainscale.observe.records import RankRecorder, read_run
from trainscale.observe.sampler import Sampler, interval_from_env, other_cpu_share
from trainscale.observe.stragglers import (
    StragglerWatch,
    diagnose,
    find_in_windows,
    find_straggler,
    held,
    place_of,
    summarise,
)
from trainscale.report.gather import accounting, rank_stats

NCCL = Path(__file__).resolve().parents[1] / "fixtures" / "nccl"


def test_records_are_json_lines_written_in_blocks(tmp_path):
    rec = RankRecorder(tmp_path, 3, flush_every=10, world_size=4, device="cpu")
    path = tmp_path / "metrics" / "rank-3.jsonl"
    for step in range(9):
        rec.step(step, 0.01, data_s=0.001, samples=16)
    assert len(path.read_text().splitlines()) == 1  # only meta so far: steps wait for the block
    rec.step(9, float("nan"), compute_s=0.005)  # a non-finite number is written as null, not NaN (invalid JSON)
    assert len(path.read_text().splitlines()) == 11
    rec.summary(mfu=0.1)
    rec.close()
    run = read_run(tmp_path)
    records = run["ranks"][3]
    assert records[0]["kind"] == "meta" and records[0]["world_size"] == 4 and records[0]["cpus"]
    assert records[10]["step_s"] is None and records[-1] == {**records[-1], "kind": "summary", "mfu": 0.1}
    with open(path, "a") as fh:
        fh.write('{"kind": "step", "step": 10')  # cut by a crash: skipped, the rest readable
    assert len(read_run(tmp_path)["ranks"][3]) == len(records)


def test_flops_of_a_step_and_mfu():
    model = torch.nn.Linear(64, 32)
    x = torch.randn(8, 64)

    def step():
        model(x).sum().backward()

    flops = count_step_flops(step)
    assert flops == 2 * (2 * 8 * 64 * 32)  # the forward matmul and the weight gradient's (x needs no gradient)
    assert mfu(flops, 0.001, 1e9) == pytest.approx(flops / 0.001 / 1e9)
    assert mfu(flops, 0.0, 1e9) is None and mfu(flops, 1.0, 0.0) is None
    assert cpu_probe(size=64, seconds=0.05) > 1e6  # some MFLOP/s, whatever the machine
    assert device_key("NVIDIA H100 80GB HBM3") == "H100 SXM" and device_key("AMD Instinct MI250X") == "MI250X"
    # what torch.cuda.get_device_name says of Hopper's other parts: each its own row, none mistaken for another
    names = {
        "NVIDIA H100 PCIe": "H100 PCIe",
        "NVIDIA H100 NVL": "H100 NVL",
        "NVIDIA H200": "H200 SXM",
        "NVIDIA H200 NVL": "H200 NVL",
        "NVIDIA GH200 480GB": "GH200",
        "NVIDIA A100-SXM4-80GB": "A100",
        "NVIDIA A100-PCIE-40GB": "A100",
    }
    assert {name: device_key(name) for name in names} == names
    assert PEAKS["H100 PCIe"]["bf16"] < PEAKS["H100 NVL"]["bf16"] < PEAKS["GH200"]["bf16"] == PEAKS["H100 SXM"]["bf16"]
    assert device_key("NVIDIA GeForce RTX 4090") is None and PEAKS["A100"]["bf16"] == 312e12


@pytest.fixture
def fp32_settings():
    """torch's TF32 settings as they were, put back after (the newer ``fp32_precision`` ones: reading the older
    ``allow_tf32`` after them raises)."""
    levels = [torch.backends, torch.backends.cuda.matmul, torch.backends.cudnn, torch.backends.cudnn.conv]
    saved = [level.fp32_precision for level in levels]
    yield
    for level, value in zip(levels, saved):
        level.fp32_precision = value


def test_the_mfu_peak_of_fp32_follows_torchs_tf32_settings_for_matmuls_and_convolutions(fp32_settings, monkeypatch):
    """issue 47 N11: the peak read only the matmul flag, so convolutions (TF32 by cuDNN's default) were rated
    against the plain fp32 peak (MFU up to 7x high on an H100), and torch's newer fp32_precision settings were
    not read at all."""
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    gpu, row = torch.device("cuda", 0), PEAKS["H100 SXM"]
    assert tf32_in_use() == (False, True)  # torch's defaults: matmuls in fp32, convolutions in TF32
    assert peak_for(gpu, torch.float32).flops == row["fp32"]  # a step of matmuls only
    assert peak_for(gpu, torch.float32, conv_share=1.0).flops == row["tf32"]  # a step of convolutions only
    half = peak_for(gpu, torch.float32, conv_share=0.5)
    assert half.flops == pytest.approx(1 / (0.5 / row["tf32"] + 0.5 / row["fp32"]))  # each half at its own rate
    assert "convolutions (50% of the FLOPs) at tf32, matmuls at fp32" in half.source
    assert peak_for(gpu, torch.bfloat16, conv_share=0.5).flops == row["bf16"]
    torch.backends.cuda.matmul.fp32_precision = "tf32"
    torch.backends.cudnn.conv.fp32_precision = "ieee"
    assert tf32_in_use() == (True, False)
    assert peak_for(gpu, torch.float32, conv_share=1.0).flops == row["fp32"]
    torch.backends.cuda.matmul.fp32_precision = torch.backends.cudnn.conv.fp32_precision = "none"
    torch.backends.fp32_precision = "tf32"  # "none" inherits the global setting
    assert tf32_in_use() == (True, True) and peak_for(gpu, torch.float32, conv_share=0.3).flops == row["tf32"]

    conv = torch.nn.Sequential(torch.nn.Conv2d(1, 4, 3), torch.nn.Flatten(), torch.nn.Linear(4 * 6 * 6, 10))
    flops = count_step_flops(lambda: conv(torch.randn(2, 1, 8, 8)).sum().backward())
    assert 0 < flops.conv < flops and flops.times(3).conv_share == pytest.approx(flops.conv_share)


def test_sampler_reads_this_nodes_ranks_and_gpus_through_its_seam(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINSCALE_SAMPLE_INTERVAL", "0")
    assert interval_from_env() == 0.0
    monkeypatch.setenv("TRAINSCALE_SAMPLE_INTERVAL", "bad")
    assert interval_from_env() == 5.0
    gpus = [{"index": 0, "util_pct": 87, "mem_used": 2**30, "mem_total": 2**34, "power_w": 350.0}]
    sampler = Sampler(tmp_path, interval_s=0.05, gpu_reader=lambda: gpus)
    sample = sampler.sample()
    assert sample["gpus"] == gpus and sample["procs"][0]["pid"] == os.getpid() and sample["procs"][0]["rss"] > 0
    sampler.start()
    from helpers.cli import wait_for

    wait_for(lambda: sampler.samples >= 3, 30, "three samples from the thread")
    sampler.stop()
    lines = next((tmp_path / "metrics").glob("node-*.jsonl")).read_text().splitlines()
    assert len(lines) >= 3 and json.loads(lines[-1])["kind"] == "sample"


def test_the_ranks_a_script_spawns_itself_are_one_program_to_the_sampler():
    """The ranks PyTorch's DDP tutorial starts with ``mp.spawn`` differ in their command lines only by their pipe's
    number: the sampler counts them as the node's ranks, not as other work on their cores."""
    import multiprocessing
    import time

    import psutil

    from trainscale.observe.sampler import _program

    spawned = [multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,)) for _ in range(2)]
    for process in spawned:
        process.start()

    def cmdline(pid: int) -> list[str]:  # once the child has exec'd python (an empty line until then)
        deadline = time.monotonic() + 30
        line = psutil.Process(pid).cmdline()
        while not any("spawn_main" in part for part in line):
            assert time.monotonic() < deadline, line
            line = psutil.Process(pid).cmdline()
        return line

    try:
        lines = [cmdline(process.pid) for process in spawned]
    finally:
        for process in spawned:
            process.terminate()
            process.join()
    assert lines[0] != lines[1], lines
    assert _program(lines[0]) == _program(lines[1])
    assert _program(["python", "train.py", "--seed", "1"]) != _program(["python", "train.py", "--seed", "2"])


def test_the_sampler_threads_first_reading_covers_its_interval(tmp_path):
    """psutil keeps the system-wide CPU reading's last sample per thread: unprimed, the thread's first
    sample said 0% busy while this process kept a CPU busy."""
    sampler = Sampler(tmp_path, interval_s=0.3, gpu_reader=lambda: []).start()
    while sampler.samples < 1:  # keep one CPU busy until the thread has sampled
        pass
    sampler.stop()
    first = json.loads(next((tmp_path / "metrics").glob("node-*.jsonl")).read_text().splitlines()[0])
    assert first["rank_cpus_busy_pct"] >= 50 and first["cpu_pct"] > 0, first


def test_other_work_on_the_ranks_cpus_is_their_busy_time_less_the_ranks_own():
    quiet = {
        "kind": "sample",
        "cpu_pct": 95.0,
        "rank_cpus": 2,
        "rank_cpus_busy_pct": 190.0,
        "procs": [{"cpu_pct": 96.0}, {"cpu_pct": 97.0}],
    }  # sampling noise: the ranks read a bit above the CPUs
    busy = {**quiet, "rank_cpus_busy_pct": 200.0, "procs": [{"cpu_pct": 75.0}, {"cpu_pct": 75.0}]}
    assert other_cpu_share([quiet]) == 0.0
    assert other_cpu_share([busy]) == pytest.approx(0.25)
    assert other_cpu_share([busy, quiet]) == pytest.approx(0.125)
    assert other_cpu_share([{"kind": "sample", "cpu_pct": 50.0}]) is None  # written before the CPUs were sampled


def test_a_process_spinning_beside_the_ranks_shows_as_other_work(tmp_path):
    """For real: a sibling-less "rank" (this process) samples while another process burns a second of CPU
    on the same CPUs."""
    import subprocess
    import sys

    sampler = Sampler(tmp_path, interval_s=3600, gpu_reader=lambda: [])
    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 1.0: pass"
    subprocess.run([sys.executable, "-c", spin], check=True, timeout=60)
    sample = sampler.sample()
    sampler.stop()
    assert sample["rank_cpus"] == len(os.sched_getaffinity(0))
    # about one CPU-second in about one second, on this process's CPUs
    assert other_cpu_share([sample]) > 0.6 / sample["rank_cpus"], sample


def _ranks(
    slow: int | None, *, data: bool = True, n: int = 45, slow_from: int = 0, extra: dict[str, float] | None = None
) -> dict[int, list[dict]]:
    """Four ranks whose steps all take 0.1 s (a synchronous step): ``slow`` loses 30 ms in its data wait
    (else its forward), or ``extra``, and the others wait for it that much longer at the all-reduce."""
    out = {}
    for rank in range(4):
        meta = {"kind": "meta", "rank": rank, "node": f"n{rank // 2 + 1}", "cpus": [2 * rank, 2 * rank + 1]}
        steps = []
        for step in range(n):
            late = rank == slow and step >= slow_from
            more = (extra or {"data_s" if data else "compute_s": 0.03}) if late else {}
            phases = {"data_s": 0.01, "compute_s": 0.03, "backward_s": 0.02, "optimizer_s": 0.005}
            phases = {k: v + more.get(k, 0.0) for k, v in phases.items()} | {
                k: v for k, v in more.items() if k not in phases
            }
            own = sum(v for k, v in phases.items() if k != "loader_s")
            steps.append({"kind": "step", "step": step, "step_s": 0.1, **phases, "comm_s": 0.1 - own})
        out[rank] = [meta, *steps]
    return out


def test_the_rank_that_arrives_last_is_named_with_its_phase_and_its_cost():
    why: list[str] = []
    assert find_straggler(_ranks(None), why=why) is None
    assert find_straggler(_ranks(2), window=30, why=why) is None  # not enough steps yet (two windows)
    # slow only in the last window: a burst, not yet a straggler; slow in both: named
    assert find_straggler(_ranks(2, slow_from=25), why=why) is None
    assert why[0].startswith("rank ") and "under the 10.0 ms a straggler needs" in why[0], why  # none late
    assert why[1:] == [
        "fewer than two ranks with two full windows",
        "the latest rank changed between the windows (0, then 2)",
    ]
    assert find_straggler(_ranks(2, slow_from=5)) is not None
    found = find_straggler(_ranks(2))
    assert (found.rank, found.host, found.phase) == (2, "n2", "data")
    assert found.late_s == pytest.approx(0.03) and found.cost == pytest.approx(0.3) and found.cause == ""
    assert found.describe().startswith(
        "rank 2 on n2 arrives last at the collectives, 30.0 ms after the others each step: host work between steps"
    )
    assert "Without it the job would take ~30% less time: 30.0 ms of each 100.0 ms step" in found.describe()
    assert find_straggler(_ranks(1, data=False)).phase == "forward"
    loader = find_straggler(_ranks(1, extra={"data_s": 0.03, "loader_s": 0.029}))
    assert loader.phase == "loader" and "DataLoader workers" in loader.cause
    # 30 ms no phase holds most of: said so, no phase guessed
    spread = find_straggler(_ranks(1, extra={"data_s": 0.01, "compute_s": 0.01, "backward_s": 0.01}))
    assert spread.phase == "unexplained" and "unexplained" in spread.describe() and spread.cause == ""
    # two phases that hold it between them (a block recomputed in backward under activation checkpointing: its
    # forward once in each): both named, in the step's order, with their sum; neither alone was the story
    both = find_straggler(_ranks(1, extra={"backward_s": 0.0155, "compute_s": 0.0145}))
    assert both.phase == "forward+backward" and both.mine_s - both.others_s == pytest.approx(0.03)
    assert "30.0 ms after the others each step: its forward and its backward's computing (" in both.describe()
    assert find_straggler(_ranks(1, extra={"backward_s": 0.027, "compute_s": 0.003})).phase == "backward"
    # a DataLoader fetched in both of the two (a batch before the forward, another between forward and backward)
    split = find_straggler(_ranks(1, extra={"data_s": 0.016, "between_s": 0.014, "loader_s": 0.029}))
    assert split.phase == "loader" and "DataLoader workers" in split.cause
    block = {"function": "Net.block", "file": "train.py", "line": 71, "share": 0.9, "samples": 80}
    places = {"forward": {**block, "samples": 60}, "backward": block, "data": {**block, "function": "f"}}
    assert place_of(places, "forward+backward") == block and place_of(places, "optimizer+data")["function"] == "f"
    assert place_of(None, "forward") is None and place_of({"data": block}, "forward+backward") is None


def _held_every(every: int, n: int = 45, hold: float = 0.4, phase: str = "data_s") -> dict[int, list[dict]]:
    """Four ranks in step; every ``every`` steps rank 0 spends ``hold`` more in ``phase`` (an evaluation between
    steps) and the others wait for it at the next collective."""
    ranks = _ranks(None, n=n)
    for rank, records in ranks.items():
        for record in records[1:]:
            if record["step"] % every == every - 1:
                record["step_s"] += hold
                record[phase if rank == 0 else "comm_s"] += hold
    return ranks


def test_work_that_holds_the_others_up_every_few_steps_is_named_by_its_mean_where_it_recurs():
    """Rank 0 evaluating for 400 ms every 10 steps: the medians see nothing (9 steps of 10 are in step), and the
    others' wait was said as communication "while the ranks arrive together" and rank 0's as a data wait."""
    why: list[str] = []
    found = find_straggler(_held_every(10), why=why)
    assert (found.rank, found.phase, found.spikes) == (0, "data", (2, 20)), why
    assert found.late_s == pytest.approx(0.04) and found.step_s == pytest.approx(0.14)
    assert found.describe().startswith(
        "rank 0 on n1 takes longer in 2 of its last 20 steps, about 400.0 ms each, and the others wait for it "
        "(40.0 ms per step on average): host work between steps"
    ), found.describe()
    assert "40.0 ms of each 140.0 ms step on average" in found.describe()
    # once in each window: a burst (another job's, a collector's pause), not named
    assert find_straggler(_held_every(20), why=why) is None
    assert why[-1].endswith("not recurring"), why
    # in no one phase: not named either (its own time spread over its phases, as a busy host's jitter is)
    spread = _held_every(10)
    for record in spread[0][1:]:
        if record["step"] % 10 == 9:
            record["data_s"] -= 0.4
            record["compute_s"] += 0.15
            record["backward_s"] += 0.15
            record["optimizer_s"] += 0.1
    assert find_straggler(spread, why=why) is None and why[-1].endswith("in no one phase"), why
    # rank 0 waiting for a CPU throughout (other work on its cores): contention, which the medians name where
    # it lasts, not work in some steps
    contended = _held_every(10)
    for record in contended[0][1:]:
        record["cpu_wait_s"] = 0.03
    assert find_straggler(contended, why=why) is None and why[-1].endswith("waiting for a CPU as long"), why
    # every 50 steps of 200: the report looks at the run's two halves too
    assert diagnose(_held_every(50, n=201, hold=1.0)).straggler.spikes == (2, 100)
    assert find_straggler(_held_every(50, n=201, hold=1.0)) is None  # the live watch's 20-step windows cannot tell


def _in_turns(late_of, n: int = 61, hold: float = 0.03) -> dict[int, list[dict]]:
    """Four ranks in step; at step ``i`` rank ``late_of(i)`` (None: none) spends ``hold`` more in its data wait,
    and the others wait for it at the collective."""
    ranks = _ranks(None, n=n)
    for rank, records in ranks.items():
        for record in records[1:]:
            late = late_of(record["step"])
            if late is not None:
                record["step_s"] += hold
                record["data_s" if rank == late else "comm_s"] += hold
    return ranks


def test_ranks_taking_turns_are_said_to_and_no_one_of_them_is_named_a_straggler():
    """Each step another rank holds the others up (a file system slow for a random rank): the medians of one
    rank's windows can make it the latest, but it was last in a third of the steps only. The report says the
    ranks take turns, where, and what it costs; no straggler."""
    why: list[str] = []
    found = diagnose(_in_turns(lambda i: i % 3), why=why)  # ranks 0, 1, 2 in turn
    assert found.straggler is None and found.turns is not None, why
    assert found.turns.phase == "data" and found.turns.late_s == pytest.approx(0.03)
    assert sorted(found.turns.ranks.values()) == [20, 20, 20] and found.turns.steps == 60
    # rank 0 in 3 steps of 5, rank 1 in the others: its medians make rank 0 the straggler, the steps do not
    three_of_five = _in_turns(lambda i: 0 if i % 5 < 3 else 1)
    assert find_straggler(three_of_five).rank == 0
    found = diagnose(three_of_five, why=why)
    assert found.straggler is None and found.turns.ranks == {0: 24, 1: 16}, why  # the 40 steps it was named from
    assert why[-1] == "rank 0 held the others up 60% of the time only", why
    # the live watch, from the summaries the ranks publish (each step's own time by its number): the same veto
    windows = {r: summarise(records) for r, records in three_of_five.items()}
    assert find_in_windows(windows).rank == 0 and held({r: w["own"] for r, w in windows.items()}) == pytest.approx(
        {0: 0.72, 1: 0.48}
    )
    assert found.turns.describe().startswith(
        "the ranks take turns holding the others up, no one rank most of the time: each step the last to arrive "
        "at the collectives comes 30.0 ms after the others on average (rank "
    ), found.turns.describe()
    # one rank late in most steps, another now and then: a straggler, not turns
    mostly = diagnose(_in_turns(lambda i: 2 if i % 5 else 1))
    assert mostly.straggler is not None and mostly.straggler.rank == 2 and mostly.turns is None
    # in step: neither
    assert diagnose(_in_turns(lambda i: None)).turns is None
    # turns too small to matter (1 ms of a 100 ms step): nothing said
    assert diagnose(_in_turns(lambda i: i % 4, hold=0.001)).turns is None
    # every rank waiting as long for a CPU each step: a busy host's jitter, not turns to fix
    busy = _in_turns(lambda i: i % 3)
    for records in busy.values():
        for record in records[1:]:
            record["cpu_wait_s"] = 0.031
    assert diagnose(busy).turns is None
    # one step each rank waited long for a CPU (a loaded CI run: 1.0-1.4 s once, under 1 ms otherwise): turns still
    once = _in_turns(lambda i: i % 3)
    for records in once.values():
        records[5]["cpu_wait_s"] = 2.5  # its mean 41 ms a step, over the 30 ms lateness
    assert diagnose(once).turns is not None
    # only the late rank of each step waited for a CPU that step (another job's bursts): not turns either
    bursts = _in_turns(lambda i: i % 3)
    for rank, records in bursts.items():
        for record in records[1:]:
            record["cpu_wait_s"] = 0.025 if record["step"] % 3 == rank else 0.0
    assert diagnose(bursts).turns is None


def test_the_turns_test_leaves_a_straggler_it_has_no_evidence_against():
    """A review's cases: the veto needs steps that show other ranks late by a straggler's margin."""
    unnumbered = _ranks(1, data=False)
    for records in unnumbered.values():
        for record in records[1:]:
            del record["step"]  # no step numbers to align: no evidence either way
    assert diagnose(unnumbered).straggler.rank == 1
    contended = _ranks(1, data=False)  # late because it waits for a CPU: contention is its lateness too
    for rank, records in contended.items():
        for record in records[1:]:
            record["cpu_wait_s"] = 0.03 if rank == 1 else 0.0
    found = diagnose(contended).straggler
    assert found.rank == 1 and found.cause.startswith("It waited for a CPU 30.0 ms per step")
    # rank 0's evaluation every 10 steps beside the others' jitter (up to 6 ms of 100 ms steps, the last rank a
    # different one each step): the jitter is under a straggler's margin, the evaluation is rank 0's alone
    jittery = _held_every(10, n=201, hold=0.4)
    for rank, records in jittery.items():
        for record in records[1:]:
            if record["step"] % 10 != 9 and record["step"] % 4 == rank:
                record["compute_s"] += 0.006
                for other in (r for r in jittery if r != rank):
                    jittery[other][record["step"] + 1]["comm_s"] += 0.006
                    jittery[other][record["step"] + 1]["step_s"] += 0.006
                record["step_s"] += 0.006
    found = diagnose(jittery)
    assert found.straggler is not None and found.straggler.rank == 0 and found.turns is None, found
    # every rank waits 8 ms for a CPU each step, rank 0 alone evaluates: its hold-up is no contention of its own
    waiting = _held_every(10)
    for records in waiting.values():
        for record in records[1:]:
            record["cpu_wait_s"] = 0.008
    assert find_straggler(waiting).rank == 0


def test_a_cause_is_named_only_with_its_evidence():
    bound = _ranks(3, data=False)
    bound[3][0]["cpus"] = [6]  # fewer CPUs than the others
    assert find_straggler(bound).cause.startswith("Its CPU binding has 1 CPU(s), the others' 2")
    shared = _ranks(1, data=False)
    for rank in (0, 1):  # both ranks of its node on the same CPUs: no evidence against the late one
        shared[rank][0]["cpus"] = [0, 1]
    assert find_straggler(shared).cause == ""


def test_other_work_on_a_ranks_cores_is_named_only_with_its_run_queue_wait():
    """The busy-core kind (benchmarks/diagnosis.py): a rank slowed by another process on its cores waited for a
    CPU (the kernel's run queue) for its lateness; a rank that lost its time sleeping (I/O, a slow fetch) did
    not, and no contention is said of it."""
    spread = {"data_s": 0.01, "compute_s": 0.01, "backward_s": 0.01}
    contended = _ranks(1, extra=spread)
    for rank, records in contended.items():
        for record in records[1:]:
            record["cpu_wait_s"] = 0.028 if rank == 1 else 0.002
    found = find_straggler(contended)
    assert (found.rank, found.phase) == (1, "unexplained")
    assert found.cause.startswith("It waited for a CPU 28.0 ms per step") and "the others 2.0 ms" in found.cause
    sleeping = _ranks(1, data=False)
    for records in sleeping.values():
        for record in records[1:]:
            record["cpu_wait_s"] = 0.002
    assert find_straggler(sleeping).cause == ""
    assert find_straggler(_ranks(1, data=False)).cause == ""  # no figure (not Linux): nothing said
    # no phase, no evidence, and every rank waits as long for a CPU as this lateness: a busy host's jitter, no
    # straggler; a phase that holds it is named whatever the host
    jitter = _ranks(1, extra=spread)
    for records in jitter.values():
        for record in records[1:]:
            record["cpu_wait_s"] = 0.035
    assert find_straggler(jitter) is None
    slow_forward = _ranks(1, data=False)
    for records in slow_forward.values():
        for record in records[1:]:
            record["cpu_wait_s"] = 0.035
    assert find_straggler(slow_forward).phase == "forward"


def test_straggler_watch_says_it_once(tmp_path):
    for rank, records in _ranks(1).items():
        rec = RankRecorder(tmp_path, rank, flush_every=1000, node=records[0]["node"])
        for r in records[1:]:
            rec.step(r["step"], r["step_s"], **{k: v for k, v in r.items() if k.endswith("_s") and k != "step_s"})
        rec.close()
    said = []
    watch = StragglerWatch(tmp_path, say=said.append)
    assert watch.check() is not None and watch.check() is None  # named once
    assert len(said) == 1 and said[0].startswith("trainscale: straggler: rank 1 on n1 arrives last")
    events = read_run(tmp_path)["events"]
    assert events[0]["kind"] == "straggler" and (events[0]["rank"], events[0]["phase"]) == (1, "data")
    assert events[0]["message"] == said[0].removeprefix("trainscale: straggler: ")
    # the late rank was flagged; once it records where its time goes, the watch names the place, once
    assert (tmp_path / "metrics" / "late-rank-1").exists() and not (tmp_path / "metrics" / "late-rank-0").exists()
    at = {"function": "get_batch", "file": "train.py", "line": 121, "share": 0.9, "samples": 250}
    with open(tmp_path / "metrics" / "rank-1.jsonl", "a") as fh:
        fh.write(json.dumps({"kind": "place", "places": {"data": at}}) + "\n")
    assert watch.check().place == at and watch.check() is None and len(said) == 2
    assert said[1].endswith(
        "(40.0 ms on it, 10.0 ms on the others); its time goes in `get_batch` (train.py:121): "
        "90% of 250 samples of its stack there. Without it the job would take ~30% less time: 30.0 ms "
        "of each 100.0 ms step"
    ), said[1]
    assert read_run(tmp_path)["events"][-1]["place"] == at


def test_straggler_watch_reads_only_new_lines_and_keeps_two_windows(tmp_path):
    from trainscale.observe.stragglers import RankTail

    path = tmp_path / "rank-0.jsonl"
    meta = json.dumps({"kind": "meta", "rank": 0, "node": "n1"})
    steps = [
        json.dumps({"kind": "step", "step": i, "step_s": 0.1, "data_s": 0.01, "compute_s": 0.05}) for i in range(100)
    ]
    path.write_text(meta + "\n" + "\n".join(steps[:60]) + "\n" + steps[60][:20])  # the last line half written
    tail = RankTail(path, keep=40)
    first = tail.read()
    assert first[0]["kind"] == "meta" and [r["step"] for r in first[1:]] == list(range(20, 60))
    with open(path, "a") as fh:  # the line completed, and more
        fh.write(steps[60][20:] + "\n" + "\n".join(steps[61:]) + "\n")
    offset = tail.offset
    again = tail.read()
    assert [r["step"] for r in again[1:]] == list(range(60, 100)) and again[0] == first[0]
    assert tail.offset == path.stat().st_size > offset  # the next read starts where this one ended


@pytest.mark.parametrize(
    "log, networks, missing",
    [
        ("lumi-ofi-2nodes.log", ("ofi",), False),
        ("lumi-socket-fallback.log", ("socket",), True),
        ("ib-2nodes.log", ("ib",), True),
        ("single-node.log", (), False),
    ],
)
def test_transport_read_from_nccl_logs(log, networks, missing):
    found = parse_nccl_log((NCCL / log).read_text())
    assert found.networks == networks and found.plugin_missing == missing


def test_a_socket_fallback_on_a_fast_network_is_named_with_the_fix():
    ofi = parse_nccl_log((NCCL / "lumi-ofi-2nodes.log").read_text())
    socket = parse_nccl_log((NCCL / "lumi-socket-fallback.log").read_text())
    assert judge(ofi, expected="ofi", multi_node=True).level == "ok"
    warn = judge(socket, expected="ofi", multi_node=True)
    assert warn.level == "warning" and "talks over socket, not the cluster's fast network (ofi)" in warn.message
    assert "plugin could not be loaded" in warn.message and "aws-ofi-rccl" in warn.hint
    assert judge(socket, expected="ofi", multi_node=True, required=True).level == "error"
    assert judge(socket, expected="ofi", multi_node=False).level == "ok"  # one node: no network needed
    assert judge(socket, expected="", multi_node=True).level == "ok"  # the profile expects nothing
    assert judge(socket, expected="ofi", multi_node=True, backend="gloo").message.startswith("gloo (CPU ranks)")


def test_arm_sends_ncclss_lines_to_a_file_unless_the_user_chose(tmp_path):
    env = {}
    path = arm(env, tmp_path)
    assert (
        env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT,NET" and env["NCCL_DEBUG_FILE"] == str(path)
    )
    mine = {"NCCL_DEBUG": "WARN"}
    assert arm(mine, tmp_path) is None and mine == {"NCCL_DEBUG": "WARN"}


def test_sacct_row_and_cpu_efficiency():
    import subprocess

    text = (
        "4711|train|COMPLETED|0:0|00:10:00|n[1-2]|0|8|00:40:00||2\n"
        "4711.batch|batch|COMPLETED|0:0|00:10:00|n1||4|00:00:01|200M|1\n"
        "4711.0|python|COMPLETED|0:0|00:09:58|n[1-2]||8|00:39:59|1.5G|2\n"
    )
    row, note = accounting("4711", lambda argv, **_: subprocess.CompletedProcess(argv, 0, text, ""))
    assert row["State"] == "COMPLETED" and row["cpu_efficiency"] == pytest.approx(0.5)
    assert row["MaxRSS_bytes"] == int(1.5 * 2**30)


def test_rank_stats_from_records():
    records = _ranks(None, data=True)[0]
    records.append({"kind": "summary", "mfu": 0.42, "peak_mem_bytes": 2**20})
    stats = rank_stats(0, records)
    assert stats.steps == 45 and stats.step_median_s == pytest.approx(0.1) and stats.mfu == 0.42
    assert stats.shares["data"] == pytest.approx(0.01) and stats.shares["comm"] == pytest.approx(0.035)
    assert stats.shares["other"] == pytest.approx(0.0, abs=1e-9)
    # exposed communication is the records' own field (the recorder's end-of-backward callbacks), nothing else's
    loop = [
        {"kind": "meta", "rank": 0},
        *(
            {
                "kind": "step",
                "step": i,
                "step_s": 0.1,
                "data_s": 0.01,
                "compute_s": 0.02,
                "backward_s": 0.02,
                "comm_s": 0.03,
                "optimizer_s": 0.01,
            }
            for i in range(5)
        ),
        {"kind": "epoch", "epoch": 1},
    ]
    shares = rank_stats(0, loop).shares
    assert shares["comm"] == pytest.approx(0.03) and shares["backward"] == pytest.approx(0.02)
    assert shares["other"] == pytest.approx(0.01)


def test_report_refuses_what_it_cannot_read(tmp_path):
    from trainscale.errors import ConfigError
    from trainscale.report import build

    accepts = (
        "a run directory (the one `trainscale run` names at its end), a `trainscale bench` study directory "
        "(results.json), a `trainscale sweep` directory (sweep.json), or the id of a job submitted with "
        "`trainscale slurm`"
    )
    with pytest.raises(ConfigError, match="is neither a directory nor a SLURM job id") as caught:
        build(str(tmp_path / "nowhere"), None)
    assert caught.value.hint == f"trainscale report takes {accepts}"
    with pytest.raises(ConfigError, match="is not a run, study or sweep directory") as caught:
        build(str(tmp_path), None)
    assert caught.value.hint == f"trainscale report takes {accepts}"


def test_the_report_names_other_work_on_the_ranks_cpus(tmp_path):
    from trainscale.report.gather import Gathered
    from trainscale.report.verdict import findings

    def sample(busy: float) -> dict:
        return {
            "kind": "sample",
            "cpu_pct": 99.0,
            "rank_cpus": 2,
            "rank_cpus_busy_pct": busy,
            "procs": [{"cpu_pct": 70.0}, {"cpu_pct": 70.0}],
        }

    busy = findings(Gathered(source=tmp_path, ranks=[], samples={"n1": [sample(200.0)]}, events=[]))
    assert [f.message for f in busy if f.level == "problem"] == [
        "other work kept 30% of the ranks' CPUs on n1 busy: every rank there ran slower for it (another job or "
        "process on the same cores; an exclusive allocation or a quiet node avoids it)"
    ]
    assert not findings(Gathered(source=tmp_path, ranks=[], samples={"n1": [sample(145.0)]}, events=[]))


def test_a_rank_late_in_every_other_step_is_said_to_be_so_with_its_mean_cost():
    """A GAN's loop (two optimizers: two steps an iteration) whose generator's forward is slow on rank 1 holds the
    others up in every other step. Its medians fall between the two kinds of step: it was said to arrive last
    "each step", 20 ms after the others; it takes 40 ms longer in half of them."""
    found = diagnose(_in_turns(lambda i: 1 if i % 2 else None, hold=0.04)).straggler
    assert (found.rank, found.phase) == (1, "data") and found.spikes is not None
    held_in, steps = found.spikes
    assert steps >= 20 and held_in / steps == pytest.approx(0.5, abs=0.05), found.spikes
    assert found.late_s == pytest.approx(0.02, rel=0.1) and found.step_s == pytest.approx(0.12, rel=0.1)
    assert found.describe().startswith(f"rank 1 on n1 takes longer in {held_in} of its last {steps} steps, about 4")
    # late in every step by as much: "each step", as before
    always = diagnose(_in_turns(lambda i: 1, hold=0.04)).straggler
    assert always.spikes is None and "arrives last at the collectives, 40.0 ms after" in always.describe()
    # its lateness is its own mean's: a spike of rank 0's in one step (a checkpoint), which makes rank 0's mean the
    # largest, is not taken for it (the windows' rule alone: the report's turns test would weigh the spike too)
    spiked = _in_turns(lambda i: 1 if i % 2 else None, hold=0.04)
    for rank, records in spiked.items():
        record = next(r for r in records if r.get("step") == 50)
        record["step_s"] += 0.6
        record["data_s" if rank == 0 else "comm_s"] += 0.6
    found = find_straggler(spiked)
    assert found.rank == 1 and found.late_s == pytest.approx(0.02, rel=0.15), found
