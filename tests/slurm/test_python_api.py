"""``trainscale.slurm`` from Python on the local 2-node cluster: a function submitted, awaited and its result
returned; a failing rank's traceback raised by ``job.result()``; a cancelled job; a map over 3 parameters as
one array job. The functions live in a module written to the test's directory (imported again on the
nodes, by reference) and in the test itself (a lambda: pickled by value, as a notebook's would be)."""

from __future__ import annotations

import sys
import time

import pytest

import trainscale
from trainscale.errors import RankFailed, SlurmError

FUNCTIONS = """
import os
import threading

import trainscale


def world(scale):
    with trainscale.init() as rt:
        total = rt.sum(float(rt.rank + 1))  # an all-reduce across the nodes (none on one rank)
        print(f"rank {rt.rank} of {rt.world_size} on {os.environ.get('SLURMD_NODENAME')}", flush=True)
        return {"rank": rt.rank, "world": rt.world_size, "sum": total * scale}


def fails(bad_rank):
    with trainscale.init() as rt:
        if rt.rank == bad_rank:
            raise ValueError(f"deliberate failure on rank {rt.rank}")
        rt.barrier()


def forever():
    print("started", flush=True)
    threading.Event().wait()
"""


@pytest.fixture
def api(slurm_cluster, tmp_path, monkeypatch):
    """The functions' module importable here (and, through the pickled call's import path, on the nodes);
    the options every job shares."""
    (tmp_path / "ts_jobs.py").write_text(FUNCTIONS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("TRAINSCALE_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.chdir(tmp_path)
    import ts_jobs

    yield (
        ts_jobs,
        {
            "profile": "local-test",
            "time": "00:05:00",
            "launcher": "srun",
            "cpus_per_task": 1,
            "python": sys.executable,
            "output_dir": str(tmp_path / "jobs"),
        },
    )
    sys.modules.pop("ts_jobs", None)


def test_a_function_on_two_nodes_returns_and_a_failing_rank_raises(api):
    ts_jobs, options = api
    ok = trainscale.slurm.submit(ts_jobs.world, 10, nodes=2, gpus_per_node=1, **options)
    bad = trainscale.slurm.submit(ts_jobs.fails, 1, nodes=2, gpus_per_node=1, **options)
    assert ok.state in ("PENDING", "RUNNING", "COMPLETING", "COMPLETED"), ok.state
    assert ok.result(timeout=240) == {"rank": 0, "world": 2, "sum": 30.0}  # 1 + 2 over both nodes, x 10
    assert ok.state == "COMPLETED"
    assert "rank 1 of 2 on n2" in ok.logs(rank=1) and "rank 0 of 2 on n1" in ok.logs(rank=0)
    assert [r["rank"] for r in ok.results()] == [0, 1]
    with pytest.raises(RankFailed) as failed:
        bad.result(timeout=240)
    assert failed.value.rank == 1 and "deliberate failure on rank 1" in failed.value.traceback
    assert "failed on rank 1" in str(failed.value)
    assert isinstance(failed.value.__cause__, ValueError)  # the rank's own exception, sent back
    assert bad.state == "FAILED"
    again = trainscale.slurm.Job.attach(ok.job_id)  # from its record, as `trainscale jobs` knows it
    assert again.result() == ok.result()


def test_map_is_one_array_job_and_cancel_cancels(api):
    ts_jobs, options = api
    jobs = trainscale.slurm.map_array(ts_jobs.world, [1, 2, 3], nodes=1, gpus_per_node=1, **options)
    assert [j.job_id.rsplit("_", 1)[1] for j in jobs] == ["0", "1", "2"]
    assert len({j.job_id.split("_")[0] for j in jobs}) == 1  # one array job
    by_value = trainscale.slurm.map_array(lambda a, b: a * b, [2, 3], [5, 7], nodes=1, gpus_per_node=1, **options)
    endless = trainscale.slurm.submit(ts_jobs.forever, nodes=1, gpus_per_node=1, **options)
    assert [j.result(timeout=240)["sum"] for j in jobs] == [1.0, 2.0, 3.0]
    assert [j.result(timeout=240) for j in by_value] == [10, 21]
    assert "rank 0 of 1 on" in jobs[2].logs(rank=0)
    deadline = time.monotonic() + 120
    while endless.state != "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.5)
    endless.cancel()
    assert endless.wait(timeout=120).state == "CANCELLED"
    with pytest.raises(SlurmError, match="CANCELLED"):
        endless.result()
