"""One metrics call, every tracker: the real libraries write real files, read back with their own readers
(TensorBoard's EventAccumulator, MLflow's client, W&B's offline run file, csv), from a built-in workload
on 2 ranks (the trackers chosen in a config file's [train] table) and from ``rt.log`` in user code on 2 gloo
ranks (``reduce=`` combining the ranks' values into rank 0)."""

from __future__ import annotations

import csv
import json
import struct
from pathlib import Path

import pytest
from helpers.cli import in_process
from helpers.multiproc import run_on_ranks


def wandb_history(run_file: Path, wanted: str = "history") -> list[dict[str, float]]:
    """The history rows (or ``wanted="config"``: the config updates) of a W&B offline run file (``run-<id>.wandb``):
    a 7-byte header (``:W&B``, magic, version), then LevelDB-log records (32 KiB blocks; checksum, length, type)
    holding protobuf Records."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    rows, pending, pos, block = [], b"", 7, 32768
    while pos + 7 <= len(data):
        room = block - pos % block
        if room < 7:  # a block's tail too short for a header is padding
            pos += room
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            pos += room
            continue
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk  # FULL/FIRST start, MIDDLE/LAST continue
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            if record.WhichOneof("record_type") == wanted == "history":
                rows.append(
                    {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
                )
            elif record.WhichOneof("record_type") == wanted == "config":
                rows.append(
                    {
                        item.key or "/".join(item.nested_key): json.loads(item.value_json)
                        for item in record.config.update
                    }
                )
    return rows


@pytest.mark.slow
def test_a_workload_writes_every_tracker_chosen_in_a_config_file(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (tmp_path / "job.toml").write_text('[train]\ntrackers = ["tensorboard", "wandb", "mlflow", "csv"]\n')
    done = in_process(
        "run",
        "--nproc-per-node",
        "2",
        "--log-dir",
        "logs",
        "--workload",
        "cnn",
        "--max-steps",
        "6",
        "--log-every",
        "0",
        "--config",
        "job.toml",
        cwd=tmp_path,
        env={"OMP_NUM_THREADS": "1"},
        drop=("WANDB_", "MLFLOW_"),
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run = next(p for p in (tmp_path / "logs").iterdir() if (p / "trackers.json").exists() and not p.is_symlink())
    said = [line for line in done.stdout.splitlines() if "metrics go to" in line]
    assert len(said) == 1, done.stdout  # where each tracker writes: once, on rank 0
    for where in ("tensorboard --logdir", "wandb offline", "mlflow file://", f"csv {run}/metrics.csv"):
        assert where in said[0], said[0]
    assert f"Files: run directory {run}" in done.stdout, done.stdout

    tensorboard = EventAccumulator(str(run / "tensorboard"))
    tensorboard.Reload()
    assert [e.step for e in tensorboard.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]
    assert [e.step for e in tensorboard.Scalars("val/accuracy")] == [6]

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3's own switch for reading its file store
    client = MlflowClient((run / "mlruns").as_uri())
    run_id = json.loads((run / "trackers.json").read_text())["mlflow_run_id"]
    assert [m.step for m in client.get_metric_history(run_id, "train/loss")] == [1, 2, 3, 4, 5, 6]
    assert client.get_run(run_id).info.status == "FINISHED" and client.get_run(run_id).info.run_name == run.name

    with open(run / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    losses = [(int(r["step"]), float(r["value"])) for r in rows if r["key"] == "train/loss"]
    assert [s for s, _ in losses] == [1, 2, 3, 4, 5, 6]
    assert [e.value for e in tensorboard.Scalars("train/loss")] == pytest.approx([v for _, v in losses])
    # each value keeps its own step's time (read back together at the end, they once all had the flush's)
    stamps = [float(r["time"]) for r in rows if r["key"] == "train/loss"]
    assert stamps == sorted(stamps) and len(set(stamps)) > 1, stamps
    assert [e.wall_time for e in tensorboard.Scalars("train/loss")] == pytest.approx(stamps, abs=2e-3)
    assert [m.timestamp / 1000 for m in client.get_metric_history(run_id, "train/loss")] == pytest.approx(
        stamps, abs=2e-3
    )
    # the run's configuration as hyperparameters, each tracker's own way
    assert client.get_run(run_id).data.params["max_steps"] == "6"
    assert client.get_run(run_id).data.params["workload"] == "cnn"
    assert json.loads((run / "hyperparameters.json").read_text())["world_size"] == 2
    assert "_hparams_/session_start_info" in tensorboard.PluginTagToContent("hparams")

    offline = list((run / "wandb").glob("offline-run-*"))
    assert len(offline) == 1, list((run / "wandb").iterdir())
    history = wandb_history(next(offline[0].glob("run-*.wandb")))
    config = {
        k: v for update in wandb_history(next(offline[0].glob("run-*.wandb")), "config") for k, v in update.items()
    }
    assert config["max_steps"] == 6 and config["workload"] == "cnn", config
    assert [h["_step"] for h in history if "train/loss" in h] == [1, 2, 3, 4, 5, 6]
    assert any("val/test_loss" not in h and "val/loss" in h for h in history)


def log_from_every_rank(run_dir: str) -> None:
    import trainscale

    with trainscale.init(run_dir=run_dir) as rt:  # no trackers chosen: rt.log writes a CSV file
        for step in range(3):
            rt.log({"mean_rank": rt.rank, "two": 2.0}, step=step, reduce="mean")
            rt.log({"max_rank": rt.rank + step}, step=step, reduce="max")
            rt.log({"own_rank": rt.rank}, step=step)  # rank 0's own value; the others' are ignored


def test_rt_log_reduces_over_ranks_into_rank_zero(tmp_path):
    run_on_ranks(log_from_every_rank, 2, str(tmp_path / "run"))
    with open(tmp_path / "run" / "metrics.csv", newline="") as fh:
        rows = [(int(r["step"]), r["key"], float(r["value"])) for r in csv.DictReader(fh)]
    assert rows == [
        row
        for step in range(3)
        for row in (
            (step, "mean_rank", 0.5),
            (step, "two", 2.0),
            (step, "max_rank", 1.0 + step),
            (step, "own_rank", 0.0),
        )
    ]


def test_a_scripts_command_line_options_are_hyperparameters_of_their_own(tmp_path, monkeypatch):
    """``python train.py --lr 0.1 --batch-size=32 --amp``: lr, batch_size and amp are parameters of their own in
    every tracker that has parameters (MLflow's params, W&B's config, TensorBoard's hparams), read back with
    each one's own reader; the command line is kept beside them."""
    import os
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import plugin_data_pb2

    (tmp_path / "train.py").write_text(
        "import trainscale\n"
        "with trainscale.init(trackers='tensorboard,wandb,mlflow,csv') as rt:\n"
        "    rt.log({'loss': 1.0}, step=0)\n"
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("WANDB_", "MLFLOW_", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TRAINSCALE_"))
    }
    done = subprocess.run(
        [sys.executable, "train.py", "--lr", "0.1", "--batch-size=32", "--amp"],
        cwd=tmp_path,
        env={**env, "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    run = (tmp_path / "trainscale-runs" / "latest").resolve()

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient((run / "mlruns").as_uri())
    params = client.get_run(json.loads((run / "trackers.json").read_text())["mlflow_run_id"]).data.params
    assert (params["lr"], params["batch_size"], params["amp"]) == ("0.1", "32", "True"), params
    assert params["command"] == "train.py --lr 0.1 --batch-size=32 --amp", params

    (offline,) = (run / "wandb").glob("offline-run-*")
    config = {k: v for update in wandb_history(next(offline.glob("run-*.wandb")), "config") for k, v in update.items()}
    assert (config["lr"], config["batch_size"], config["amp"]) == (0.1, 32, True), config

    tensorboard = EventAccumulator(str(run / "tensorboard"))
    tensorboard.Reload()
    start = plugin_data_pb2.HParamsPluginData.FromString(
        tensorboard.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    ).session_start_info
    assert start.hparams["lr"].number_value == 0.1 and start.hparams["batch_size"].number_value == 32
    assert start.hparams["amp"].number_value == 1, start.hparams  # torch's hparams writes a bool as a number
    assert json.loads((run / "hyperparameters.json").read_text())["lr"] == 0.1
