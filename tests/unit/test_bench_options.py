"""`trainscale bench` and `trainscale plan --tune` resolve their options in the one order (issue 23 item 2):
StudySpec/TuneSpec defaults < --config's [bench]/[tune] table < TRAINSCALE_BENCH_*/TRAINSCALE_TUNE_* < the
command line, with a misspelt name refused as for [train]."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainscale.cli import bench, tune
from trainscale.errors import ConfigError

TABLES = """
[bench]
configs = "cpu,2"
scaling = "strong"
epochs = 3
batch_size = 8
out_dir = "study"

[tune]
nproc_per_node = 2
batches = [8, 16]
budget = 60
loader = "dataloader"
device = "cpu"

[train]  # another command's table: neither bench nor tune reads it
lr = 0.5
"""


def test_bench_file_then_environment_then_command_line(tmp_path):
    (tmp_path / "study.toml").write_text(TABLES)
    spec, _ = bench.build(
        ["--config", str(tmp_path / "study.toml"), "--batch-size", "32"],
        environ={"TRAINSCALE_BENCH_EPOCHS": "4", "TRAINSCALE_BENCH_BATCH_SIZE": "12"},
    )
    assert (spec.workload, spec.configs, spec.scaling) == ("cnn", "cpu,2", "strong")  # the file
    assert spec.epochs == 4  # the environment beats the file
    assert spec.batch_size == 32  # the command line beats both
    assert spec.out_dir == Path("study") and spec.max_steps is None  # a file's string is the field's Path

    sweep, _ = bench.build(["--workload", "cnn"], environ={"TRAINSCALE_BENCH_SWEEP_BATCHES": "16,32"})
    assert sweep.sweep_batches == (16, 32) and (sweep.configs, sweep.epochs, sweep.batch_size) == ("1,2", 2, 16)


@pytest.mark.parametrize(
    "table, message",
    [
        ("epoch = 3", "(?s)config file: unknown bench option 'epoch'.*did you mean 'epochs'"),
        ("sweep_batch = [16]", "(?s)unknown bench option 'sweep_batch'.*did you mean 'sweep_batches'"),
        ('script = "train.py"', "unknown bench option 'script'"),  # SCRIPT is the command's, not an option
        ("sweep_batches = [16, 0]", "--sweep-batch '16,0' contains 0"),
    ],
)
def test_bench_refuses_what_the_table_cannot_mean(tmp_path, table, message):
    (tmp_path / "study.toml").write_text(f"[bench]\n{table}\n")
    with pytest.raises(ConfigError, match=message):
        bench.build(["--config", str(tmp_path / "study.toml")], environ={})


def test_tune_file_then_environment_then_command_line(tmp_path):
    (tmp_path / "tune.toml").write_text(TABLES)
    out = str(tmp_path / "tuned.toml")
    spec, _ = tune.build(
        ["--config", str(tmp_path / "tune.toml"), "--budget", "90", "--out", out],
        environ={"TRAINSCALE_TUNE_BUDGET": "120", "TRAINSCALE_TUNE_BATCHES": "4,8"},
    )
    assert (spec.nproc_per_node, spec.loader, spec.device, spec.workload) == (2, "dataloader", "cpu", "cnn")
    assert spec.batches == (4, 8)  # the environment beats the file
    assert spec.budget == 90  # the command line beats both
    plain, _ = tune.build(["--workload", "cnn", "--out", out], environ={})
    assert (
        plain.nproc_per_node,
        plain.batch_size,
        plain.budget,
        plain.max_steps,
        plain.strategy,
        plain.loader,
        plain.batches,
    ) == (1, 16, 300.0, 30, "ddp", "tensor", ())


def test_tune_refuses_a_misspelt_name(tmp_path):
    (tmp_path / "tune.toml").write_text("[tune]\nbudget_s = 60\n")
    with pytest.raises(ConfigError, match="(?s)unknown tune option 'budget_s'.*did you mean 'budget'"):
        tune.build(["--config", str(tmp_path / "tune.toml"), "--out", str(tmp_path / "t.toml")], environ={})
    with pytest.raises(ConfigError, match="(?s)TRAINSCALE_TUNE_LOADR names no tune option.*did you mean 'loader'"):
        tune.build(["--out", str(tmp_path / "t.toml")], environ={"TRAINSCALE_TUNE_LOADR": "dataloader"})
