"""The vit workload end to end on 2 ranks, under each in-tree strategy, through the real launcher."""

from __future__ import annotations

import importlib.util
import json

import pytest

from trainscale.cli.main import main

needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", "zero1", pytest.param("deepspeed", marks=needs_deepspeed)])
def test_vit_trains_on_two_ranks(in_tmp, strategy):
    code = main(
        [
            "run",
            "--nproc-per-node",
            "2",
            "--log-dir",
            "logs",
            "--workload",
            "vit",
            "--strategy",
            strategy,
            "--max-steps",
            "6",
            "--epochs",
            "1",
            "--depth",
            "2",
            "--log-every",
            "0",
            "--metrics-out",
            "m.json",
        ]
    )
    assert code == 0
    metrics = json.loads((in_tmp / "m.json").read_text())
    assert metrics["workload"] == "vit" and metrics["world_size"] == 2 and metrics["steps"] == 6
    assert metrics["strategy"] == strategy and metrics["epochs"][0]["train_loss"] > 0


def test_vit_bad_shape_is_refused_before_launch(in_tmp, capsys):
    code = main(["run", "--nproc-per-node", "2", "--log-dir", "logs", "--workload", "vit", "--patch-size", "5"])
    err = capsys.readouterr().err
    assert code == 2 and "--patch-size 5 does not divide" in err
    assert not (in_tmp / "logs").exists()
