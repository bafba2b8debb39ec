"""Choosing trackers: the names, the packages they need, and the three places a workload's choice comes from
(--tracker, [train] trackers, TRAINSCALE_TRAIN_TRACKERS), each refused with its fix before anything runs."""

from __future__ import annotations

import importlib.util

import pytest

from trainscale.errors import ConfigError
from trainscale.train.options import parse
from trainscale.train.trackers import Trackers, parse_trackers


def test_names_are_a_comma_list_or_a_sequence_each_once():
    assert parse_trackers("tensorboard, CSV,csv") == ("tensorboard", "csv")
    assert parse_trackers(["mlflow", "wandb"]) == ("mlflow", "wandb")
    assert parse_trackers(None) == () and parse_trackers("") == ()


def test_unknown_tracker_and_missing_package_are_refused_with_the_fix(monkeypatch):
    with pytest.raises(ConfigError, match="tracker 'tensorbord' unknown") as unknown:
        parse_trackers("tensorbord")
    assert "did you mean 'tensorboard'" in unknown.value.hint
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(ConfigError, match="tracker wandb needs the wandb package") as missing:
        parse_trackers("csv,wandb")
    assert "pip install wandb, or leave" in missing.value.hint


def test_a_workloads_trackers_resolve_in_the_one_order(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINSCALE_TRAIN_TRACKERS", "csv,tensorboard")
    assert parse([], prog="t")[0].trackers == ("csv", "tensorboard")
    assert parse(["--tracker", "mlflow,csv"], prog="t")[0].trackers == ("mlflow", "csv")  # the command line wins
    monkeypatch.delenv("TRAINSCALE_TRAIN_TRACKERS")
    (tmp_path / "job.toml").write_text('[train]\ntrackers = ["wandb"]\n')
    assert parse(["--config", str(tmp_path / "job.toml")], prog="t")[0].trackers == ("wandb",)
    with pytest.raises(ConfigError, match="tracker 'tb' unknown"):
        parse(["--tracker", "tb"], prog="t")


def test_a_value_that_is_not_a_number_is_refused_naming_its_key(tmp_path):
    trackers = Trackers(["csv"], tmp_path)
    try:
        with pytest.raises(ConfigError, match="'loss' is list"):
            trackers.log({"loss": [1.0, 2.0]}, step=0)
    finally:
        trackers.close()
