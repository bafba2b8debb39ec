"""A plain `pip install trainscale` (no extras) runs its own cnn workload offline.

A fresh venv gets exactly trainscale's core requirements (and what they need) hard-linked from the test
environment, and trainscale's source: no scikit-learn, matplotlib, transformers, deepspeed, hjson...
Then the README's first run trains in it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import trainscale
from helpers.container_image import copy_distributions

CORE = ("torch", "numpy", "python-hostlist", "psutil", "rich", "cloudpickle")
OPTIONAL = ("scikit-learn", "matplotlib", "transformers", "accelerate", "tokenizers", "tensorboard", "deepspeed",
            "hjson", "wandb", "mlflow-skinny", "nbclient", "ipykernel")


def test_cnn_runs_with_nothing_optional_installed(tmp_path):
    venv = tmp_path / "plain"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    copy_distributions(CORE, site, refuse=OPTIONAL)  # refuses to copy an optional package, should torch pull one
    (site / "trainscale-src.pth").write_text(str(Path(trainscale.__file__).parents[1]) + "\n")
    python = str(venv / "bin" / "python")
    probe = subprocess.run([python, "-c", "import sklearn"], capture_output=True, text=True)
    assert probe.returncode != 0 and "No module named 'sklearn'" in probe.stderr
    done = subprocess.run([python, "-m", "trainscale", "run", "--nproc-per-node", "2", "--log-dir",
                           str(tmp_path / "logs"), "--workload", "cnn", "--epochs", "1"],
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "1438 training samples" in done.stdout and "Epoch 1: loss" in done.stdout, done.stdout
