"""Preemption on the real cluster: SLURM's warning signal mid-training -> checkpoint at a step boundary
-> requeue -> the next attempt resumes -> final weights equal an uninterrupted run's, bitwise."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest
import torch
from helpers.cli import trainscale, wait_for

CNN = [
    "--workload",
    "cnn",
    "--data",
    "synthetic",
    "--samples",
    "1024",
    "--batch-size",
    "16",
    "--epochs",
    "4",
    "--checkpoint-every",
    "4",
    "--log-every",
    "0",
]


def newest_weights(directory: Path) -> dict[str, torch.Tensor]:
    return torch.load(sorted(directory.glob("ckpt-*.pt"))[-1], weights_only=True)["model"]


@pytest.fixture(scope="module")
def reference_weights(slurm_cluster, tmp_path_factory) -> dict[str, torch.Tensor]:
    """The same job, never signalled, in the same layout (2 nodes x 2 ranks, as many threads per rank):
    one reference for both launch modes, which give every rank the same rank, data shard and threads."""
    tmp = tmp_path_factory.mktemp("reference")
    done = trainscale(
        tmp,
        "slurm",
        "--profile",
        "local-test",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--time",
        "00:10:00",
        "--launcher",
        "srun",
        "--requeue",
        "--output-dir",
        str(tmp / "jobs"),
        "--python",
        sys.executable,
        "--submit",
        "--watch",
        "--poll",
        "0.5",
        *CNN,
    )
    job = re.search(r"submitted job (\d+)", done.stderr)
    assert done.returncode == 0 and job, f"{done.stdout}\n{done.stderr}"
    return newest_weights(next((tmp / "jobs").glob("trainscale-cnn-*")) / "checkpoints")


@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_usr1_to_the_batch_shell_requeues_and_resumes_to_identical_weights(
    slurm_cluster, tmp_path, launcher, reference_weights
):
    done = trainscale(
        tmp_path,
        "slurm",
        "--profile",
        "local-test",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--time",
        "00:10:00",
        "--launcher",
        launcher,
        "--requeue",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--python",
        sys.executable,
        "--submit",
        *CNN,
    )
    m = re.search(r"submitted job (\d+)", done.stderr)
    assert done.returncode == 0 and m, f"{done.stdout}\n{done.stderr}"
    job = m.group(1)
    ckdir = next((tmp_path / "jobs").glob("trainscale-cnn-*")) / "checkpoints"  # the run directory's
    wait_for(lambda: any(ckdir.glob("ckpt-*.pt")), 180, "the first checkpoint")
    assert slurm_cluster.job_state(job) == "RUNNING", "training ended before it could be signalled"
    signalled = time.monotonic()
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job)
    wait_for(lambda: slurm_cluster.job_fields(job).get("Restarts", "0") != "0", 120, "the requeue")
    requeued = time.monotonic() - signalled
    state = slurm_cluster.wait_done(job, timeout=240)
    finished = time.monotonic() - signalled
    out = trainscale(tmp_path, "jobs", job, "--rank", "0", timeout=60).stdout
    assert state == "COMPLETED", out
    # logged before `scontrol requeue`, which ends the attempt at once (a line after it may never be written)
    assert "Preempted (SIGUSR1) at step" in out and f"requeueing SLURM job {job}" in out, out
    assert "Attempt 2 of this job" in out, out

    ours = newest_weights(ckdir)
    for key in reference_weights:
        assert torch.equal(ours[key], reference_weights[key]), key
    print(
        f"\n[preemption {launcher}] job {job}: requeued {requeued:.1f}s after SIGUSR1, COMPLETED {finished:.1f}s "
        f"after it"
    )
