"""The variables `trainscale run` adds for its workers (pure: no launch)."""

from __future__ import annotations

import pytest

from trainscale.launch.local import LocalLaunchSpec, worker_env


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train.py"
    path.write_text("pass\n")
    return str(path)


def test_only_a_run_that_may_restart_gives_its_workers_a_fresh_store(script):
    # torch 2.13 hands a restarted group the dead group's addresses through the shared store
    restarting, _ = worker_env(LocalLaunchSpec(target=script, max_restarts=2), base={})
    assert restarting["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    once, _ = worker_env(LocalLaunchSpec(target=script, max_restarts=0), base={})
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE" not in once


def test_threads_are_set_per_rank_unless_the_user_chose(script):
    extra, notes = worker_env(LocalLaunchSpec(target=script, nproc_per_node=2), base={})
    assert int(extra["OMP_NUM_THREADS"]) >= 1 and notes and notes[0].startswith("OMP_NUM_THREADS=")
    extra, notes = worker_env(LocalLaunchSpec(target=script, nproc_per_node=2), base={"OMP_NUM_THREADS": "3"})
    assert "OMP_NUM_THREADS" not in extra and notes == []
