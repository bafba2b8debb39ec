"""`--nproc-per-node` above what the node has: more ranks than visible GPUs is refused before launch (a rank
would get no GPU), more CPU ranks than cores is said in one line (issue 38: 64 ranks on 2 cores started
without a word, load 61)."""

from __future__ import annotations

import os

import pytest

from trainscale.errors import ConfigError
from trainscale.launch.torchrun import nproc_fits


def test_more_cpu_ranks_than_cores_is_said(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    assert nproc_fits(2, "2") is None
    said = nproc_fits(64, "64")
    assert said.startswith("warning: 64 ranks on 2 core(s): they take turns") and "measures the sharing" in said


def test_more_ranks_than_gpus_is_refused_and_gpu_is_not(monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 4)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})  # few cores: GPU ranks are not judged by them
    assert nproc_fits(4, "4") is None and nproc_fits(4, "gpu") is None
    with pytest.raises(ConfigError, match=r"--nproc-per-node 8 but this node shows 4 GPU\(s\)") as refused:
        nproc_fits(8, "8")
    assert "CUDA_VISIBLE_DEVICES=" in refused.value.hint


def test_the_launcher_says_it_before_starting(in_tmp, capsys, monkeypatch):
    from trainscale.cli.run import build_spec

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # CPU ranks, on any machine
    (in_tmp / "train.py").write_text("print('hi')\n")
    spec = build_spec(["--nproc-per-node", "3", "train.py"], environ={})
    assert spec.nproc_per_node == 3
    assert "trainscale: warning: 3 ranks on 1 core(s)" in capsys.readouterr().err
