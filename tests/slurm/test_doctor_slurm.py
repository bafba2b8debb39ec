"""`trainscale slurm ... -m trainscale.doctor --network` on the local 2-node cluster: one report on rank 0
with a passing all-reduce from all 4 ranks, in both launch modes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest


def _trainscale(tmp_path: Path, *argv: str, timeout: float = 280) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRAINSCALE_STATE_DIR": str(tmp_path / "state")}
    return subprocess.run(
        [sys.executable, "-m", "trainscale", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )


@pytest.mark.parametrize("launcher", ("torchrun", "srun"))
def test_doctor_network_on_two_nodes(slurm_cluster, tmp_path, launcher):
    done = _trainscale(
        tmp_path,
        "slurm",
        "--profile",
        "local-test",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--time",
        "00:05:00",
        "--launcher",
        launcher,
        "--output-dir",
        str(tmp_path / "jobs"),
        "--python",
        sys.executable,
        "--submit",
        "--watch",
        "--poll",
        "0.5",
        "--watch-timeout",
        "240",
        "-m",
        "trainscale.doctor",
        "--network",
        "--size-mib",
        "1",
    )
    job = re.search(r"submitted job (\d+)", done.stderr)
    assert job and done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    log = _trainscale(tmp_path, "jobs", job.group(1), "--rank", "0", timeout=60)
    assert log.returncode == 0, log.stderr
    text = log.stdout
    assert text.count("Summary:") == 1 and "from 4 rank(s)" in text, text
    for rank in range(4):
        assert re.search(rf"\[ok\s*\] rank {rank} all-reduce .*sum over 4 ranks correct", text), text
    assert re.search(r"rank 2 host\s+\S+, local rank 0, node 1,", text), text  # ranks 2-3 on the second node
    # The two emulated nodes share one machine: their equal CPU sets must not count as ranks competing.
    assert "ranks 0 and 2" not in text and "ranks 1 and 3" not in text, text
