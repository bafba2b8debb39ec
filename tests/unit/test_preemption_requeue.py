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
    assert said == ["Preempted at step 7; requeueing SLURM job 4242 (scontrol requeue); this attempt ends here",
                    "requeued SLURM job 4242 (scontrol requeue)",
                    "Preempted at step 9; not a SLURM job: run the same command again to resume from the checkpoint"]
