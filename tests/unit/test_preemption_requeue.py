"""Preemption.requeue: what rank 0 says and does (scontrol faked at the subprocess boundary)."""

from __future__ import annotations

import os
import stat
from types import SimpleNamespace

from trainscale.runtime.preemption import MARKER, Preemption


def _fake_scontrol(bin_dir, log):
    bin_dir.mkdir()
    script = bin_dir / "scontrol"
    script.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)


def test_the_log_line_is_written_before_scontrol_ends_the_attempt(tmp_path, monkeypatch):
    log = tmp_path / "calls"
    _fake_scontrol(tmp_path / "bin", log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    seen = []
    preemption = Preemption(SimpleNamespace(is_main=True, is_distributed=False))
    try:
        # scontrol has not run yet when the line is handed over: it is on disk before SLURM stops the step
        what = preemption.requeue(before=lambda plan: seen.append((plan, log.exists())))
    finally:
        preemption.restore()
    assert seen == [("requeueing SLURM job 4242 (scontrol requeue); this attempt ends here", False)]
    assert log.read_text().split() == ["requeue", "4242"] and what.startswith("requeued SLURM job 4242")


def test_without_scontrol_the_batch_script_is_asked_through_a_marker(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "7")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    monkeypatch.setenv("TRAINSCALE_JOB_DIR", str(tmp_path))
    seen = []
    preemption = Preemption(SimpleNamespace(is_main=True, is_distributed=False))
    try:
        what = preemption.requeue(before=seen.append)
    finally:
        preemption.restore()
    assert seen == [] and "scontrol is not reachable" in what
    assert (tmp_path / MARKER).read_text() == "7_3\n"


def test_requeue_and_log_says_the_line_first_then_the_outcome(tmp_path, monkeypatch):
    log = tmp_path / "calls"
    _fake_scontrol(tmp_path / "bin", log)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    said = []
    preemption = Preemption(SimpleNamespace(is_main=True, is_distributed=False))
    try:
        preemption.requeue_and_log("Preempted at step 7", said.append)
        monkeypatch.delenv("SLURM_JOB_ID")
        preemption.requeue_and_log("Preempted at step 9", said.append)
    finally:
        preemption.restore()
    assert said == [
        "Preempted at step 7; requeueing SLURM job 4242 (scontrol requeue); this attempt ends here",
        "requeued SLURM job 4242 (scontrol requeue)",
        "Preempted at step 9; not a SLURM job: run the same command again to resume from the checkpoint",
    ]


def test_the_last_save_is_timed_from_measured_saves_to_end_before_the_limit(monkeypatch):
    """issue 36 item 3: with the job's end known (TRAINSCALE_JOB_END) the flag goes up once the time left holds no
    more than 1.5 saves, the steps until the ranks next agree (10) and 5 s; never without a measured save, and a
    job end already past when the run starts (another job's, a skewed clock) is ignored."""
    import time

    now = time.time()
    monkeypatch.setenv("TRAINSCALE_JOB_END", str(int(now) + 600))
    preemption = Preemption(SimpleNamespace(is_main=True, is_distributed=False))
    try:
        assert not preemption.requested()  # no save measured yet: nothing to time from
        preemption.save_seconds = lambda: 100.0
        preemption._last_call = None
        # steps of 20 s: 11 of them (to the next agreement) and 1.5 saves need 375 s; 380 s left still hold them
        assert not any(preemption._time_is_up(now + t) for t in range(0, 240, 20))
        assert preemption._time_is_up(now + 240)  # 360 s left: the save starts now
        assert preemption.received.startswith("the time limit in ") and "a save takes 100 s" in preemption.received
    finally:
        preemption.restore()
    monkeypatch.setenv("TRAINSCALE_JOB_END", str(int(now) - 5))
    past = Preemption(SimpleNamespace(is_main=True, is_distributed=False))
    try:
        past.save_seconds = lambda: 100.0
        assert past.job_end is None and not past.requested()
    finally:
        past.restore()
