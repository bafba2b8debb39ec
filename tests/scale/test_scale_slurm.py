"""trainscale's SLURM machinery at 8 and 16 nodes x 2 ranks, on a real 16-node cluster on this machine
(tests/slurm/cluster.sh with TRAINSCALE_TEST_CLUSTER_NODES=16: 16 slurmd's, one slurmctld, munge).

A tiny course-style script (scripts/tiny_course.py: rank from SLURM_PROCID/RANK, gloo, DDP, records and
checkpoints through trainscale) in both launch modes:

- 8 nodes, torchrun mode: trains to the end (the reference);
- 8 nodes, srun mode, at the same time: preempted (SIGUSR1 to the batch shell) after step 4, checkpoints,
  requeues, resumes, and ends with the reference's weights bitwise; `trainscale jobs JOB --rank R` and
  `trainscale report JOB` work on it;
- 16 nodes, each mode: the first rank on node n11 raises at step 5; the watcher's explanation and
  `trainscale jobs JOB` name that rank, on n11, with its traceback, and the other 31 ranks in one line.

2 ranks per node (32 at once): the machine has 2 cores and 24 GB; 32 ranks of torch are about 5 GB
(PSS; 150 MiB each) and the 16 agents of torchrun mode 2.5 GB more. Wall times and the peak memory
used are printed (-s).
"""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from helpers.cli import trainscale, wait_for

SCRIPT = Path(__file__).resolve().parent / "scripts" / "tiny_course.py"
STEPS = 12


class PeakMemory:
    """The machine's memory in use (MemTotal - MemAvailable), sampled every 0.5 s in a thread."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    @staticmethod
    def used() -> int:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        return (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) * 1024

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            self.peak = max(self.peak, self.used())

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak / 2**30


def submit(cluster, tmp: Path, nodes: int, launcher: str, *args: str, requeue: bool = False) -> tuple[str, Path]:
    env = {**cluster.env, "TRAINSCALE_PREEMPT_CHECK_EVERY": "1"}  # the hold below agrees at every step
    done = trainscale(
        tmp,
        "slurm",
        "--profile",
        "local-test",
        "--nodes",
        str(nodes),
        "--gpus-per-node",
        "2",
        "--time",
        "00:30:00",
        "--launcher",
        launcher,
        *(["--requeue"] if requeue else []),
        "--output-dir",
        str(tmp / "jobs"),
        "--python",
        sys.executable,
        "--submit",
        str(SCRIPT),
        "--steps",
        str(STEPS),
        "--checkpoints",
        str(tmp / "checkpoints"),
        *args,
        env=env,
        timeout=120,
    )
    m = re.search(r"submitted job (\d+) .*run directory (\S+)", done.stderr)
    assert done.returncode == 0 and m, f"{done.stdout}\n{done.stderr}"
    return m.group(1), Path(m.group(2))


def cli(cluster, tmp: Path, *argv: str) -> str:
    done = trainscale(tmp, *argv, env=cluster.env, timeout=300)
    assert done.returncode == 0, f"trainscale {' '.join(argv)}: {done.stdout}\n{done.stderr}"
    return done.stdout


def final_weights(directory: Path) -> dict[str, torch.Tensor]:
    newest = sorted(directory.glob("ckpt-*.pt"))[-1]
    assert newest.name == f"ckpt-{STEPS:08d}.pt", newest
    return torch.load(newest, weights_only=True)["model"]


@pytest.fixture(scope="module")
def memory():
    meter = PeakMemory()
    yield meter
    print(
        f"\n[scale] peak memory in use on this machine during the scale tests: {meter.stop():.1f} GiB "
        f"(before: {PeakMemory.used() / 2**30:.1f} GiB now)"
    )


def test_8_nodes_both_modes_train_and_a_preempted_job_resumes_bitwise(scale_cluster, tmp_path, memory):
    t0 = time.monotonic()
    ref_dir, pre_dir = tmp_path / "reference", tmp_path / "preempted"
    ref_dir.mkdir(), pre_dir.mkdir()
    reference, _ = submit(scale_cluster, ref_dir, 8, "torchrun")
    job, run_dir = submit(scale_cluster, pre_dir, 8, "srun", "--hold-at", "4", requeue=True)
    wait_for(lambda: (pre_dir / "checkpoints" / "ckpt-00000004.pt").exists(), 600, "the preempted job's step 4")
    assert scale_cluster.job_state(job) == "RUNNING"
    scale_cluster.run("scancel", "--signal=USR1", "--batch", job)
    wait_for(lambda: scale_cluster.job_fields(job).get("Restarts", "0") != "0", 300, "the requeue")
    states = {
        reference: scale_cluster.wait_done(reference, timeout=900),
        job: scale_cluster.wait_done(job, timeout=900),
    }
    took = time.monotonic() - t0
    assert states == {reference: "COMPLETED", job: "COMPLETED"}, (states, cli(scale_cluster, pre_dir, "jobs", job))

    rank0 = cli(scale_cluster, pre_dir, "jobs", job, "--rank", "0")
    assert "Preempted (SIGUSR1) at step 4" in rank0 and f"requeueing SLURM job {job}" in rank0, rank0
    assert "resumed at step 4, attempt 2" in rank0 and f"finished {STEPS} steps" in rank0, rank0
    last = cli(scale_cluster, pre_dir, "jobs", job, "--rank", "15")  # the last node's second rank: its own file
    assert "Traceback" not in last, last
    ours, theirs = final_weights(pre_dir / "checkpoints"), final_weights(ref_dir / "checkpoints")
    for key in theirs:
        assert torch.equal(ours[key], theirs[key]), key

    report = cli(scale_cluster, pre_dir, "report", job)
    assert "16 rank(s) on 8 node(s)" in report, report
    assert (run_dir / "report" / "report.html").exists()
    print(
        f"\n[scale] 8 nodes x 2 ranks, torchrun (job {reference}) and srun (job {job}, preempted at step 4, "
        f"requeued, resumed bitwise) side by side: {took:.0f}s"
    )


@pytest.mark.parametrize("launcher", ["srun", "torchrun"])
def test_16_nodes_a_rank_on_node_11_fails_and_is_named(scale_cluster, tmp_path, launcher, memory):
    t0 = time.monotonic()
    job, run_dir = submit(scale_cluster, tmp_path, 16, launcher, "--fail-on", "n11", "--fail-at", "5")
    state = scale_cluster.wait_done(job, timeout=900)
    took = time.monotonic() - t0
    out = cli(scale_cluster, tmp_path, "jobs", job)
    assert state == "FAILED", out
    raised = re.search(r"injected failure of rank (\d+) on n11 at step 5", out)
    assert raised, out
    rank = int(raised.group(1))
    failure = out[out.index(f"==> failure of job {job} <==") :]
    assert f"First failing rank: rank {rank} on n11" in failure, failure
    assert "Traceback of rank" in failure and 'tiny_course.py", line' in failure, failure
    assert len(failure.splitlines()) < 30, failure  # 31 other ranks in a line or two, not one line each
    if launcher == "srun":
        assert rank == 20  # SLURM's block distribution: tasks 20 and 21 on the 11th node

    own = cli(scale_cluster, tmp_path, "jobs", job, "--rank", str(rank))
    assert f"injected failure of rank {rank} on n11" in own, own
    report = cli(scale_cluster, tmp_path, "report", job)
    assert "32 rank(s) on 16 node(s)" in report, report
    print(
        f"\n[scale] 16 nodes x 2 ranks, {launcher} mode (job {job}): rank {rank} on n11 failed at step 5 and was "
        f"named; job to FAILED in {took:.0f}s"
    )
