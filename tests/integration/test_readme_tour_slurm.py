"""The tour's `trainscale slurm`, profiles and bench sections: one part of README's journey
(tests/helpers/readme.py), on the two-node SLURM test cluster."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers.readme import part_fixture

readme = part_fixture("tour_slurm")


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1200)  # the first test to run sets the part's run up
def test_tour_study_writes_its_results_where_out_says(readme):
    results = json.loads((readme.dir / "study1" / "results.json").read_text())
    assert [r["config"] for r in results["runs"]] == ["cpu", "1", "2"], results["runs"]
    assert all(r["status"] == "ok" for r in results["runs"]), results["runs"]


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1200)  # the first test to run sets the part's run up
def test_readme_study_on_slurm_runs_each_configuration_as_a_job_and_reports_it(readme, slurm_cluster):
    """`trainscale bench --slurm --configs 1 --nodes 2`: each configuration a real batch job, the study's numbers
    what the jobs measured; `trainscale jobs` and `trainscale report` then read the jobs."""
    (study,) = [
        p.parent
        for p in (readme.dir / "bench-out").glob("*/results.json")
        if not p.parent.is_symlink() and [r["config"] for r in json.loads(p.read_text())["runs"]] == ["1", "2n"]
    ]  # not bench-out/latest
    runs = json.loads((study / "results.json").read_text())["runs"]
    # nodes and world size as the ranks reported them from inside the jobs, not as planned
    assert [(r["config"], r["status"], r["nodes"], r["world_size"]) for r in runs] == [
        ("1", "ok", 1, 1),
        ("2n", "ok", 2, 4),
    ]
    for r in runs:
        assert r["epochs"] and r["samples_per_s"] > 0 and r["slurm_job"]
        assert slurm_cluster.job_state(r["slurm_job"]) == "COMPLETED"
        assert Path(r["log_dir"]).is_dir()
    # a speedup above what the shared machine allows (other jobs on its cores) is kept, but not as a result
    speedup = runs[1]["speedup"] or (runs[1]["rejected"] or {}).get("speedup")
    printed = readme.output("trainscale bench --workload cnn --slurm")
    assert speedup > 0 and "| DDP 2 nodes x 2 CPU ranks | 4 |" in printed, printed
    logs = readme.trainscale("jobs", runs[1]["slurm_job"], "--rank", "0")
    assert logs.returncode == 0 and "Epoch 1:" in logs.stdout, logs.stderr
    # the study's report finds each job's records in its run directory; a job id gives that run's page
    report = readme.trainscale("report", str(study), "--text")
    assert report.returncode == 0, report.stderr
    two_nodes = report.stdout.split("== DDP 2 nodes x 2 CPU ranks (02-2n) ==")[1]
    assert [line.split()[0] for line in two_nodes.splitlines() if re.match(r"^\d\s", line)] == ["0", "1", "2", "3"]
    job = readme.trainscale("report", runs[1]["slurm_job"], "--text")
    assert job.returncode == 0, job.stderr
    assert f"SLURM      job {runs[1]['slurm_job']}, profile local-test" in job.stdout
    assert "ranks      4 rank(s) on 2 node(s), torchrun launch mode" in job.stdout
    assert "== SLURM accounting ==" in job.stdout


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1200)  # the first test to run sets the part's run up
def test_readme_allreduce_on_slurm_is_one_two_node_job(readme):
    (result,) = [
        r
        for r in (json.loads(p.read_text()) for p in (readme.dir / "bench-out" / "allreduce").glob("*/allreduce.json"))
        if r["num_nodes"] == 2
    ]
    assert result["world_size"] == 4
    assert [row["bytes"] for row in result["rows"]][:3] == [1024, 2048, 4096] and result["rows"][-1]["bytes"] == 4 << 20
    assert all(row["busbw_Bps"] == row["algbw_Bps"] * 1.5 > 0 for row in result["rows"])
    assert "submitted job" in readme.output("trainscale bench allreduce --slurm", "stderr")
    assert "busbw" in readme.output("trainscale bench allreduce --slurm")
