"""hf-finetune (seeds 000/001): the HF Trainer under trainscale's launch, offline, on 2 gloo ranks."""

from __future__ import annotations

import json

import pytest

from trainscale.cli.main import main

pytest.importorskip("transformers", reason="the hf-finetune workload needs transformers (pip install 'trainscale[lm]')")


def test_trainer_runs_data_parallel_with_per_device_batch_from_the_global_batch(in_tmp, capsys):
    code = main(["run", "--nproc-per-node", "2", "--log-dir", "logs", "--workload", "hf-finetune", "--max-steps", "8",
                 "--global-batch", "8", "--output-dir", "out", "--metrics-out", "m.json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    metrics = json.loads((in_tmp / "m.json").read_text())
    assert metrics["world_size"] == 2 and metrics["per_device_batch"] == 4 and metrics["steps"] == 8
    assert metrics["train_loss"] > 0


def test_global_batch_that_does_not_split_is_refused_before_launch(in_tmp, capsys):
    code = main(["run", "--nproc-per-node", "2", "--log-dir", "logs", "--workload", "hf-finetune",
                 "--global-batch", "7"])
    err = capsys.readouterr().err
    assert code == 2 and "--global-batch 7 does not split evenly over 2 rank(s)" in err
    assert not (in_tmp / "logs").exists()
