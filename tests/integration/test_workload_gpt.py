"""The gpt workload (seed 003's loop) end to end on 2 ranks through the real launcher."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from trainscale.cli.main import main

SMALL = ["--n-layer", "2", "--n-embd", "64", "--n-head", "2", "--seq-len", "64", "--log-every", "0"]


def _run(tmp, *args, env=None):
    full = {**{k: v for k, v in os.environ.items() if not k.startswith("TRAINSCALE_FAULT")}, **(env or {})}
    return subprocess.run([sys.executable, "-m", "trainscale", "run", "--nproc-per-node", "2", "--log-dir", "logs",
                           *args], cwd=tmp, env=full, capture_output=True, text=True, timeout=300)


needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")


def _fake_wandb(root):
    """A stand-in for the wandb package (not installed here) that records what the workload asks of it."""
    (root / "wandb").mkdir(parents=True)
    (root / "wandb" / "__init__.py").write_text(
        "import json, os\n"
        "class Run:\n"
        "    def __init__(self, kw): self.kw, self.logs = kw, []\n"
        "    def log(self, values, step): self.logs.append([step, values])\n"
        "    def finish(self):\n"
        "        path = os.path.join(self.kw['dir'], 'wandb-' + self.kw['name'] + '.json')\n"
        "        json.dump({'init': self.kw, 'logs': self.logs, 'finished': True}, open(path, 'w'))\n"
        "def init(**kw): return Run(kw)\n")
    return root


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", pytest.param("deepspeed:stage=3", marks=needs_deepspeed)])
def test_gpt_trains_with_accumulation_and_writes_its_experiment(in_tmp, strategy):
    code = main(["run", "--nproc-per-node", "2", "--log-dir", "logs", "--workload", "gpt", "--strategy", strategy,
                 "--max-steps", "6", "--grad-accum", "2", "--experiment-dir", "exp", "--metrics-out", "m.json",
                 *SMALL])
    assert code == 0
    exp = in_tmp / "exp"
    assert (exp / "experiment.json").exists() and json.loads((exp / "state.json").read_text())["step"] == 6
    assert sorted(p.name for p in (exp / "tensorboard").iterdir()) == ["rank0", "rank1"]
    assert any((exp / "tensorboard" / "rank1").iterdir())  # every rank writes its own stream
    metrics = json.loads((in_tmp / "m.json").read_text())
    assert metrics["steps"] == 6 and metrics["strategy"] == strategy.split(":")[0]
    # The LR schedule steps once per optimizer step, not per micro-batch, under every strategy:
    # 6 of the default 20 warm-up steps done -> 3e-4 * 7/20.
    assert metrics["epochs"][-1]["lr"] == pytest.approx(1.05e-4)
    ranks = metrics["memory"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["params"] > 0 and r["optimizer"] > 0 for r in ranks)


def test_gpt_crash_and_restart_resumes_to_the_same_loss(tmp_path):
    common = ["--workload", "gpt", "--max-steps", "12", "--checkpoint-every", "4", *SMALL]
    broken = _run(tmp_path, "--max-restarts", "1", *common, "--experiment-dir", "a",
                  env={"TRAINSCALE_FAULT": "exit:rank=1:step=6"})
    assert broken.returncode == 0, broken.stderr
    assert "Resumed experiment" in broken.stdout
    fake = _fake_wandb(tmp_path / "fake")
    pythonpath = os.pathsep.join(filter(None, [str(fake), os.environ.get("PYTHONPATH")]))
    straight = _run(tmp_path, *common, "--experiment-dir", "b", env={"PYTHONPATH": pythonpath})
    assert straight.returncode == 0, straight.stderr
    for rank in (0, 1):  # one offline wandb run per rank, grouped by experiment, every step logged
        record = json.loads((tmp_path / "b" / f"wandb-rank{rank}.json").read_text())
        assert record["init"]["group"] == "b" and record["init"]["mode"] == "offline"
        assert [step for step, d in record["logs"] if "train/loss" in d] == list(range(1, 13))
        assert record["finished"]
    a = json.loads((tmp_path / "a" / "state.json").read_text())
    b = json.loads((tmp_path / "b" / "state.json").read_text())
    assert a["step"] == b["step"] == 12 and a["loss"] == b["loss"]


def test_foreign_experiment_dir_is_refused_untouched(in_tmp, capsys):
    (in_tmp / "exp").mkdir()
    (in_tmp / "exp" / "notes.txt").write_text("mine")
    code = main(["run", "--nproc-per-node", "2", "--log-dir", "logs", "--workload", "gpt", "--experiment-dir", "exp"])
    assert code == 2 and "is not a trainscale experiment" in capsys.readouterr().err
    assert sorted(p.name for p in (in_tmp / "exp").iterdir()) == ["notes.txt"]
    assert not (in_tmp / "logs").exists()
