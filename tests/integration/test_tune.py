"""`trainscale tune` for real: short trials of the cnn workload on 2 gloo ranks within a budget, a config
file written, and `trainscale run` training with it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TRAINSCALE_")}


@pytest.mark.slow
def test_tune_searches_within_its_budget_and_run_takes_the_result(tmp_path):
    budget = 50
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "trainscale", "tune", "--workload", "cnn", "--nproc-per-node", "2",
                           "--batches", "16,32", "--budget", str(budget), "--max-steps", "10", "--out", "tuned.toml"],
                          cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr + done.stdout
    trials = re.findall(r"^\s+\d+\. (batch \d+[^\n]*?)\s{2,}(\d+) samples/s", done.stdout, re.M)
    assert trials and trials[0][0] == "batch 16", done.stdout  # the defaults first
    assert re.search(r"^best: ", done.stdout, re.M), done.stdout
    # the search stops when the next trial and the final pair would not fit: at most one trial over
    slowest = max(float(s) for s in re.findall(r"\((\d+)s\)", done.stdout))
    if len(trials) > 1:
        assert trials[1][0] == "batch 32", done.stdout  # then the next batch
    else:  # a busy machine: the first trial's pace left no room for one more and the final pair
        assert 4 * (slowest + 1) > budget, done.stdout  # (seconds printed rounded down)
    assert took <= budget + 3 * slowest + 30, done.stdout

    table = tomllib.loads((tmp_path / "tuned.toml").read_text())["train"]
    assert table["batch_size"] in (16, 32)
    run = subprocess.run([sys.executable, "-m", "trainscale", "run", "--nproc-per-node", "2", "--log-dir",
                          str(tmp_path / "logs"), "--workload", "cnn", "--config", "tuned.toml", "--max-steps", "3",
                          "--log-every", "0", "--metrics-out", "m.json"], cwd=tmp_path, env=_env(),
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    options = json.loads((tmp_path / "m.json").read_text())["options"]
    assert options["batch_size"] == table["batch_size"]
    assert options["strategy"] == table.get("strategy", "ddp")


def test_defaults_that_do_not_run_stop_the_search(tmp_path):
    env = {**_env(), "TRAINSCALE_FAULT": "raise:rank=0:step=1"}  # every trial fails in its first step
    done = subprocess.run([sys.executable, "-m", "trainscale", "tune", "--workload", "cnn", "--budget", "60",
                           "--max-steps", "5"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "the defaults do not run" in done.stderr, done.stderr + done.stdout
    assert not (tmp_path / "tuned.toml").exists()


def test_a_strategy_option_that_does_not_exist_is_refused_before_any_trial(tmp_path):
    done = subprocess.run([sys.executable, "-m", "trainscale", "tune", "--workload", "cnn", "--strategy", "ddp:bogus=1",
                           "--budget", "60", "--max-steps", "5"], cwd=tmp_path, env=_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and "has no option 'bogus'" in done.stderr, done.stderr + done.stdout
    assert "trial" not in done.stdout.lower() and not (tmp_path / "tuned.toml").exists()
