"""Self-healing jobs (issue 36 item 2) on a real 3-node test cluster: a node marked down mid-epoch (what SLURM
does when a node's daemon stops answering) is left out and the run resumes by itself, on the remaining nodes
(``--nodes 2-3``) or on a spare (``-N 2 --spare-nodes 1``), from its newest checkpoint, every sample of the
epoch once (the global cursor), the node named in the job's output and the run's report."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.cli import trainscale, wait_for
from helpers.slurm_cluster import cluster_session

CNN = [
    "--workload",
    "cnn",
    "--data",
    "synthetic",
    "--samples",
    "1536",
    "--batch-size",
    "16",
    "--epochs",
    "1",
    "--checkpoint-every",
    "4",
    "--log-every",
    "0",
]
JOB = ["--profile", "local-test", "-t", "00:10:00", "--launcher", "srun", "-c", "1", "--python", sys.executable]


@pytest.fixture(scope="module")
def cluster3():
    with cluster_session(3) as cluster:
        yield cluster


def submitted(done: subprocess.CompletedProcess[str]) -> tuple[str, Path]:
    m = re.search(r"job (\d+) .*run directory (\S+)", done.stderr)
    assert done.returncode == 0 and m, f"{done.stdout}\n{done.stderr}"
    return m.group(1), Path(m.group(2))


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "shape, lost, runs_on", [(["--nodes", "2-3"], "n3", 2), (["-N", "2", "--spare-nodes", "1"], "n2", 2)]
)
def test_a_node_lost_mid_epoch_is_left_out_and_the_run_finishes_by_itself(cluster3, tmp_path, shape, lost, runs_on):
    env = cluster3.env
    job, run_dir = submitted(
        trainscale(tmp_path, "slurm", *JOB, *shape, "--output-dir", str(tmp_path / "jobs"), "--submit", *CNN, env=env)
    )
    ckdir = run_dir / "checkpoints"
    wait_for(lambda: any(ckdir.glob("ckpt-*.pt")), 240, "the first checkpoint")
    state = cluster3.lose_node_of(job, lost)
    batch = (run_dir / f"{job}.out").read_text()
    assert state == "COMPLETED", batch[-4000:]
    assert f"node(s) {lost} lost" in batch and f"resuming on {runs_on} node(s)" in batch, batch[-4000:]
    events = [json.loads(line) for line in (run_dir / "metrics" / "events.jsonl").read_text().splitlines()]
    healed = [e for e in events if e.get("kind") == "node_lost"]
    assert len(healed) == 1 and healed[0]["nodes"] == lost, events
    report = trainscale(tmp_path, "report", str(run_dir), env=env)
    assert f"node(s) {lost} lost in job {job}" in report.stdout, report.stdout[-3000:]
    # the resumed step ran the rest of the epoch on the nodes left and ended it: its last step is the run's last
    logs = "\n".join(p.read_text() for p in (run_dir / job).rglob("*.out"))
    assert re.search(r"Resumed from .* written with world size 3, now 2", logs) or "spare" in " ".join(shape), logs
    done = re.findall(r"Epoch 1: .* step (\d+)/(\d+)", logs)
    assert done and done[-1][0] == done[-1][1], logs[-3000:]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("nodes, fewer", [("1-2", False), ("2-3", True)])
def test_a_lost_batch_host_is_requeued_by_watch_without_it_and_the_run_finishes_once(cluster3, tmp_path, nodes, fewer):
    """The batch host's node takes the batch step with it, and SLURM 22.05 keeps a --no-kill job RUNNING with
    nothing in it (every step ended) until its time limit: ``--watch`` sees the batch host down and requeues the
    job; SLURM schedules it on nodes that are up; the requeued attempt names the lost node and resumes from the
    newest checkpoint to the end of the epoch: on as many nodes when the partition has one free (``--nodes 1-2``
    of 3), else on fewer (``--nodes 2-3``: the requeued job asks for the 2 that are up)."""
    import os

    env = {**os.environ, **cluster3.env, "TRAINSCALE_STATE_DIR": str(tmp_path / "state")}
    watching = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainscale",
            "slurm",
            *JOB,
            "--nodes",
            nodes,
            "--output-dir",
            str(tmp_path / "jobs"),
            "--submit",
            "--watch",
            "--poll",
            "0.5",
            *CNN,
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: any((tmp_path / "jobs").glob("*/checkpoints/ckpt-*.pt")), 240, "the first checkpoint")
        run_dir = next((tmp_path / "jobs").glob("*/checkpoints")).parent
        job = next(p.stem for p in run_dir.glob("*.out"))  # the batch output: JOBID.out
        host = cluster3.job_fields(job)["BatchHost"]
        state = cluster3.lose_node_of(job, host, timeout=300)
        out, err = watching.communicate(timeout=120)
    finally:
        watching.kill()
    batch = (run_dir / f"{job}.out").read_text()
    assert state == "COMPLETED", batch[-4000:]
    assert watching.returncode == 0, out + err
    assert f"the batch host {host} of job {job} is down" in err and "requeued it" in err, err[-3000:]
    assert ("so it asks for 2 (of 3; --nodes MIN 2)" in err) == fewer, err[-3000:]
    assert "resuming on 2 node(s)" in batch, batch[-4000:]
    assert cluster3.job_fields(job).get("Restarts") == "1"
    assert f"node(s) {host} lost with the last attempt" in batch, batch[-4000:]
    events = [json.loads(line) for line in (run_dir / "metrics" / "events.jsonl").read_text().splitlines()]
    assert [e["nodes"] for e in events if e.get("kind") == "node_lost"] == [host], events
    report = trainscale(tmp_path, "report", str(run_dir), env=cluster3.env)
    assert f"node(s) {host} lost in job {job}" in report.stdout, report.stdout[-3000:]
    logs = "\n".join(p.read_text() for p in (run_dir / job).rglob("*.out"))
    assert "Resumed from" in logs, logs[-3000:]
    done = re.findall(r"Epoch 1: .* step (\d+)/(\d+)", logs)
    assert done and done[-1][0] == done[-1][1], logs[-3000:]
