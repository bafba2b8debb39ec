"""`trainscale plan --tune`'s search, without running anything: the knobs a spec has, the order of the coordinate
descent, the noise margin, the budget, the config file it writes and the refusals."""

from __future__ import annotations

import sys

import pytest

from trainscale.errors import ConfigError
from trainscale.plan.tune import NOISE, Search, Setting, Trial, TuneSpec, knobs, render_config

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def test_the_knobs_follow_what_the_run_can_change():
    one_cpu = TuneSpec(workload="cnn", nproc_per_node=1, cores=8, device="cpu")
    assert knobs(one_cpu) == [("batch_size", (16, 8, 32, 64)), ("threads", (None, 1, 2, 4))]
    two = TuneSpec(workload="cnn", nproc_per_node=2, cores=2, loader="dataloader", batches=(32, 64))
    assert [k for k, _ in knobs(two)] == ["batch_size", "num_workers", "bucket_cap_mb", "comm_hook"]
    assert dict(knobs(two))["comm_hook"] == (None, "fp16", "bf16", "powersgd")
    gpu_fsdp = TuneSpec(workload="cnn", nproc_per_node=4, device="cuda", strategy="fsdp")
    assert [k for k, _ in knobs(gpu_fsdp)] == ["batch_size"]  # no CPU threads, no DDP buckets
    script = TuneSpec(
        workload=None, script="train.py", script_args=("--bs", "{batch}"), nproc_per_node=2, cores=4, device="cpu"
    )
    assert [k for k, _ in knobs(script)] == ["batch_size", "threads"]


def test_coordinate_descent_keeps_only_what_beats_the_noise():
    spec = TuneSpec(workload="cnn", nproc_per_node=2, cores=2, batches=(16, 32))
    rates = {
        Setting(batch_size=16): 100.0,
        Setting(batch_size=32): 150.0,
        Setting(batch_size=32, bucket_cap_mb=1): 150.0 * (1 + NOISE / 2),  # within the noise: not kept
        Setting(batch_size=32, bucket_cap_mb=5): 180.0,
    }
    search = Search(spec)
    seen = []
    while (setting := search.next()) is not None:
        seen.append(setting)
        search.record(Trial(setting, rates.get(setting, 90.0), 10.0))
    assert seen[:3] == [Setting(batch_size=16), Setting(batch_size=32), Setting(batch_size=32, bucket_cap_mb=1)]
    assert Setting(batch_size=32, bucket_cap_mb=5, comm_hook="fp16") in seen  # the hooks are tried from the best
    assert search.best == Setting(batch_size=32, bucket_cap_mb=5)
    assert len(seen) == len(set(seen))  # nothing measured twice
    assert search.best.workload_args("ddp") == ["--batch-size", "32", "--strategy", "ddp:bucket_cap_mb=5"]


def test_a_failed_trial_is_never_best_and_the_budget_keeps_room_for_the_final_pair():
    search = Search(TuneSpec(workload="cnn", budget=100))
    search.record(Trial(Setting(batch_size=16), 100.0, 20.0))
    search.record(Trial(Setting(batch_size=8), None, 25.0, "out of memory"))
    assert search.best == Setting(batch_size=16)
    assert search.time_left(20.0)  # 20 + 3 x 25 <= 100
    assert not search.time_left(30.0)


def test_the_config_file_is_a_train_table_the_workloads_read(tmp_path):
    from trainscale.train.options import TrainOptions

    spec = TuneSpec(workload="cnn", nproc_per_node=2)
    best = Setting(batch_size=32, bucket_cap_mb=5, comm_hook="fp16")
    text = render_config(spec, best, default_rate=100.0, best_rate=130.0, host="n1")
    assert "1.30x" in text and "scale the learning rate" in text
    table = tomllib.loads(text)["train"]
    assert table == {"batch_size": 32, "strategy": "ddp:bucket_cap_mb=5,comm_hook=fp16"}
    assert set(table) <= {f.name for f in __import__("dataclasses").fields(TrainOptions)}
    plain = tomllib.loads(render_config(spec, Setting(batch_size=16), default_rate=1.0, best_rate=1.0, host="n1"))
    assert plain["train"] == {"batch_size": 16}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"workload": None}, "tune needs one target"),
        ({"workload": None, "script": "train.py", "script_args": ("--bs", "32")}, "through {batch}"),
        ({"budget": 5}, "too short for even one trial"),
        ({"max_steps": 2}, "too few steps"),
        ({"batches": (16, 0)}, "--batches '16,0' contains 0"),
        (
            {"loader": "tensr"},
            "--loader 'tensr' is not one of tensor, dataloader",
        ),  # a [tune] table has no argparse choices
        ({"device": "gpu"}, "--device 'gpu' is not one of auto, cpu, cuda"),
        ({"workload": "cnnn"}, "unknown workload 'cnnn'"),  # the Python API too, not only `trainscale plan --tune`
    ],
)
def test_bad_specs_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        TuneSpec(**kwargs)


def test_the_command_refuses_before_running(tmp_path, monkeypatch):
    from trainscale.cli.tune import build

    monkeypatch.chdir(tmp_path)
    (tmp_path / "tuned.toml").write_text("# mine\n")
    with pytest.raises(ConfigError, match="already exists: tune does not overwrite it"):
        build(["--workload", "cnn"])
    with pytest.raises(ConfigError, match="(?s)unknown workload 'cnnn'.*did you mean 'cnn'"):
        build(["--workload", "cnnn", "--out", "x.toml"])
    with pytest.raises(ConfigError, match="does not exist"):
        build(["missing.py", "--bs", "{batch}", "--out", "x.toml"])
    assert (tmp_path / "tuned.toml").read_text() == "# mine\n"
