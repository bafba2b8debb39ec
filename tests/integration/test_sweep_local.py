"""`trainscale sweep --local` then `trainscale sweep status DIR --metric loss`, as a user types them: a task whose
script exits 1 is failed with its exit code and first failing rank (not "launch failed"), and the values the
script logged with rt.log are the table's, best first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """\
import argparse
import sys

import trainscale

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float)
lr = parser.parse_args().lr
with trainscale.init() as rt:
    for step in range(3):
        rt.log({"loss": lr * (3 - step)}, step=step)
    if lr == 0.5 and rt.rank == 1:
        sys.exit(1)
"""


def trainscale(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TRAINSCALE_", "RANK", "WORLD_SIZE", "MASTER_", "SLURM_"))
    }
    return subprocess.run(
        [sys.executable, "-m", "trainscale", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
        env={**env, "OMP_NUM_THREADS": "1"},
    )


def test_a_local_sweeps_status_says_how_a_task_failed_and_ranks_by_what_was_logged(tmp_path):
    (tmp_path / "sw.py").write_text(SCRIPT)
    done = trainscale("sweep", "--local", "--nproc-per-node", "2", "--grid", "lr=0.5,0.2,0.1", "sw.py", cwd=tmp_path)
    assert done.returncode == 1, done.stderr  # one task failed
    (sweep,) = [p.parent for p in tmp_path.rglob("sweep.json")]
    assert (tmp_path / "trainscale-jobs" / ".gitignore").read_text().splitlines()[-1] == "*"  # no source to commit
    status = trainscale("sweep", "status", str(sweep), "--metric", "loss", cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    header, *rows = status.stdout.split("\n\n")[0].splitlines()
    assert header.split() == ["task", "lr", "state", "loss"]
    assert [row.split()[:3] for row in rows[:2]] == [["2", "0.1", "finished"], ["1", "0.2", "finished"]]
    assert rows[0].split()[-1] == "0.1" and rows[1].split()[-1] == "0.2"  # the last values logged
    assert rows[2].startswith("0") and "failed (first failing rank: 1 on " in rows[2]
    # how it ended, as the launcher saw it: its exit code, or (the group stopped while it was exiting) the signal
    assert "exit code 1)" in rows[2] or "failed, then stopped by SIGTERM while exiting)" in rows[2], rows[2]
    assert "launch failed" not in status.stdout
    assert "2 of 3 task(s) finished; best first by loss" in status.stdout
    nothing = trainscale("sweep", "status", str(sweep), "--metric", "accuracy", cwd=tmp_path)
    assert nothing.returncode == 2 and nothing.stdout == ""
    assert "no task of the sweep logged the metric 'accuracy'" in nothing.stderr and "logged: loss" in nothing.stderr
