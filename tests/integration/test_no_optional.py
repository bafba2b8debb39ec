"""A plain `pip install trainscale` (no extras) runs its own cnn workload offline.

A fresh venv gets exactly trainscale's core requirements (and what they need) hard-linked from the test
environment, and trainscale's source: no scikit-learn, matplotlib, transformers, deepspeed, hjson...
Then the README's first run trains in it, and a study keeps its results without the plotting extra."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.container_image import copy_distributions

import trainscale

CORE = ("torch", "numpy", "python-hostlist", "psutil", "rich", "cloudpickle")
OPTIONAL = (
    "scikit-learn",
    "matplotlib",
    "transformers",
    "accelerate",
    "tokenizers",
    "tensorboard",
    "deepspeed",
    "hjson",
    "wandb",
    "mlflow-skinny",
    "nbclient",
    "ipykernel",
)


@pytest.fixture(scope="module")
def plain_python(tmp_path_factory) -> str:
    venv = tmp_path_factory.mktemp("venvs") / "plain"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    copy_distributions(CORE, site, refuse=OPTIONAL)  # refuses to copy an optional package, should torch pull one
    (site / "trainscale-src.pth").write_text(str(Path(trainscale.__file__).parents[1]) + "\n")
    python = str(venv / "bin" / "python")
    for module, name in (("sklearn", "sklearn"), ("matplotlib", "matplotlib")):
        probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True, text=True)
        assert probe.returncode != 0 and f"No module named '{name}'" in probe.stderr
    return python


def test_cnn_runs_with_nothing_optional_installed(tmp_path, plain_python):
    python = plain_python
    done = subprocess.run(
        [
            python,
            "-m",
            "trainscale",
            "run",
            "--nproc-per-node",
            "2",
            "--log-dir",
            str(tmp_path / "logs"),
            "--workload",
            "cnn",
            "--epochs",
            "1",
        ],
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "1438 training samples" in done.stdout and "Epoch 1: loss" in done.stdout, done.stdout


@pytest.mark.slow
def test_a_study_without_matplotlib_keeps_its_results_and_its_report_says_how_to_get_plots(tmp_path, plain_python):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("TRAINSCALE_")}, "OMP_NUM_THREADS": "1"}
    bench = subprocess.run(
        [
            plain_python,
            "-m",
            "trainscale",
            "bench",
            "--workload",
            "cnn",
            "--configs",
            "1,2",
            "--epochs",
            "1",
            "--max-steps",
            "3",
            "--data",
            "synthetic",
            "--samples",
            "128",
            "--out",
            "study",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert bench.returncode == 0, bench.stdout + bench.stderr  # the study ran: a missing extra is no failure
    study = tmp_path / "study"
    results = json.loads((study / "results.json").read_text())
    assert [r["status"] for r in results["runs"]] == ["ok", "ok"] and results["plots"] == {}
    assert (study / "results.csv").read_text().count("\n") == 3 and "| DDP 2 CPU ranks | 2 |" in (
        study / "results.md"
    ).read_text()
    assert not list(study.glob("*.png"))
    assert (
        "trainscale bench: plots need matplotlib, which is not installed: pip install matplotlib" in bench.stderr
    )  # one line saying how to get the optional part
    assert "next: trainscale report study" in bench.stdout

    report = subprocess.run(
        [plain_python, "-m", "trainscale", "report", "study"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0, report.stderr
    assert "(no plots: plots need matplotlib, which is not installed: pip install matplotlib)" in report.stdout
    assert "DDP 2 CPU ranks" in (study / "report" / "report.html").read_text()
