"""`trainscale selftest --slurm` on the local 2-node cluster: both launches are real batch jobs made by
`trainscale slurm`'s plan, lint and submission; the hang job fails as it must, naming the stopped rank."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def test_selftest_runs_as_jobs_on_two_nodes_and_reports_every_check(slurm_cluster, tmp_path):
    env = {**os.environ, "TRAINSCALE_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run([sys.executable, "-m", "trainscale", "selftest", "--slurm", "--profile", "local-test",
                           "--gpus-per-node", "2", "--nodes", "2", "--time", "00:10:00", "--python", sys.executable,
                           "--poll", "0.5", "--skip", "deepspeed", "--hang-timeout", "3", "--sizes", "1MB",
                           "--out", str(tmp_path / "st")], env=env, capture_output=True, text=True, timeout=600,
                          cwd=tmp_path)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    report = json.loads((tmp_path / "st" / "selftest.json").read_text())
    rows = {c["name"]: c for c in report["checks"]}
    assert report["meta"]["world_size"] == 4 and report["meta"]["num_nodes"] == 2
    assert all(c["status"] in ("pass", "warn") for c in rows.values()), rows  # binding depends on the profile
    assert "rank(s) 3 did not arrive" in rows["hang"]["detail"]["message"]
    assert "in stop_participating" in rows["hang"]["detail"]["message"]  # its stack, through the store of a 2-node job
    assert done.stderr.count("submitted job") == 2
