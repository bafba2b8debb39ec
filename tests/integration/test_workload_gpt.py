"""The gpt workload (seed 003's loop) end to end on 2 ranks through the real launcher."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from helpers.cli import in_process

from trainscale.cli.main import main
from trainscale.workloads import text

SMALL = ["--n-layer", "2", "--n-embd", "64", "--n-head", "2", "--seq-len", "64", "--log-every", "0"]


def _run(tmp, *args, env=None):
    return in_process(
        "run", "--nproc-per-node", "2", "--log-dir", "logs", *args, cwd=tmp, env=env, drop=("TRAINSCALE_FAULT",)
    )


needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")


def _csv_steps(path, key="train/loss"):
    import csv

    with open(path, newline="") as fh:
        return [(int(r["step"]), float(r["value"])) for r in csv.DictReader(fh) if r["key"] == key]


@pytest.mark.parametrize("strategy", ["ddp", "fsdp", pytest.param("deepspeed:stage=3", marks=needs_deepspeed)])
def test_gpt_trains_with_accumulation_and_writes_its_experiment(in_tmp, monkeypatch, strategy):
    # gpt's own options from the [train] table and a TRAINSCALE_TRAIN_ variable, as the common ones (SMALL's shape)
    (in_tmp / "job.toml").write_text("[train]\nn_layer = 2\nn_embd = 64\nseq_len = 64\nlog_every = 0\n")
    monkeypatch.setenv("TRAINSCALE_TRAIN_N_HEAD", "2")
    code = main(
        [
            "run",
            "--nproc-per-node",
            "2",
            "--log-dir",
            "logs",
            "--workload",
            "gpt",
            "--strategy",
            strategy,
            "--max-steps",
            "6",
            "--grad-accum",
            "2",
            "--experiment-dir",
            "exp",
            "--metrics-out",
            "m.json",
            "--tracker",
            "tensorboard",
            "--config",
            "job.toml",
        ]
    )
    assert code == 0
    exp = in_tmp / "exp"
    assert (exp / "experiment.json").exists() and json.loads((exp / "state.json").read_text())["step"] == 6
    assert list((exp / "tensorboard").glob("events.out.tfevents.*"))  # the experiment's curves, rank 0 writes
    metrics = json.loads((in_tmp / "m.json").read_text())
    assert metrics["steps"] == 6 and metrics["strategy"] == strategy.split(":")[0]
    assert metrics["train_windows"] == (int(text.encode(text.builtin_corpus()).numel() * 0.9) - 1) // 64  # seq_len
    # The LR schedule steps once per optimizer step, not per micro-batch, under every strategy:
    # 6 of the default 20 warm-up steps done -> 3e-4 * 7/20.
    assert metrics["epochs"][-1]["lr"] == pytest.approx(1.05e-4)
    ranks = metrics["memory"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["params"] > 0 and r["optimizer"] > 0 for r in ranks)


def test_gpt_crash_and_restart_resumes_to_the_same_loss(tmp_path):
    # synchronous saves: a background save of step 4 may still be in flight when rank 1 exits at step 6 on a
    # loaded machine, and the restart then rightly starts at 0 (nothing complete to resume from)
    common = [
        "--workload",
        "gpt",
        "--max-steps",
        "12",
        "--checkpoint-every",
        "4",
        "--no-checkpoint-async",
        "--tracker",
        "csv",
        *SMALL,
    ]
    broken = _run(
        tmp_path,
        "--max-restarts",
        "1",
        *common,
        "--experiment-dir",
        "a",
        env={"TRAINSCALE_FAULT": "exit:rank=1:step=6"},
    )
    assert broken.returncode == 0, broken.stderr
    assert "Resumed experiment" in broken.stdout and "at step 4 (epoch" in broken.stdout, broken.stdout
    straight = _run(tmp_path, *common, "--experiment-dir", "b")
    assert straight.returncode == 0, straight.stderr
    a = json.loads((tmp_path / "a" / "state.json").read_text())
    b = json.loads((tmp_path / "b" / "state.json").read_text())
    assert a["step"] == b["step"] == 12 and a["loss"] == b["loss"]
    # the restarted run's curve continues its first attempt's: every step once, the same losses as straight through
    assert _csv_steps(tmp_path / "a" / "metrics.csv") == _csv_steps(tmp_path / "b" / "metrics.csv")
    assert [step for step, _ in _csv_steps(tmp_path / "b" / "metrics.csv")] == list(range(1, 13))
    # the trackers' run id is the experiment's own random id, not its directory name (two "b"s never collide)
    experiment_id = json.loads((tmp_path / "b" / "experiment.json").read_text())["id"]
    assert json.loads((tmp_path / "b" / "trackers.json").read_text())["wandb_id"] == experiment_id != "b"


# A tokenizer as `from_pretrained` finds it on a hub, made offline (BPE trained with `tokenizers` on
# a few of the corpus' topics, saved with save_pretrained); in a subprocess, as importing
# transformers sets environment variables.
MAKE_TOKENIZER = """
import sys
from pydoc_data.topics import topics
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

bpe = Tokenizer(models.BPE())
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
bpe.train_from_iterator(list(topics.values())[:40], trainers.BpeTrainer(
    vocab_size=512, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe)
tokenizer.save_pretrained(sys.argv[1])
print(len(tokenizer))
"""


def test_gpt_trains_on_a_hf_tokenizers_ids(tmp_path):
    pytest.importorskip("transformers")
    made = subprocess.run(
        [sys.executable, "-c", MAKE_TOKENIZER, str(tmp_path / "tok")],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    run = _run(
        tmp_path,
        "--workload",
        "gpt",
        "--max-steps",
        "2",
        "--tokenizer",
        str(tmp_path / "tok"),
        "--experiment-dir",
        "exp",
        "--metrics-out",
        "m.json",
        *SMALL,
    )
    assert run.returncode == 0, run.stderr
    metrics = json.loads((tmp_path / "m.json").read_text())
    byte_windows = (len(text.encode(text.builtin_corpus())) * 9 // 10 - 1) // 64
    assert metrics["vocab"] == int(made.stdout.split()[-1]) and metrics["steps"] == 2
    assert metrics["train_windows"] < byte_windows / 2  # BPE ids, several bytes per token
    # the experiment's checkpoints hold the BPE vocabulary: resuming with bytes is refused before launch
    again = _run(tmp_path, "--workload", "gpt", "--max-steps", "4", "--experiment-dir", "exp", *SMALL)
    assert again.returncode == 2 and f"was trained with --tokenizer {tmp_path / 'tok'}" in again.stderr
    assert (
        "resume with --tokenizer" in again.stderr
        and json.loads((tmp_path / "exp" / "state.json").read_text())["step"] == 2
    )


def test_foreign_experiment_dir_is_refused_untouched(in_tmp, capsys):
    (in_tmp / "exp").mkdir()
    (in_tmp / "exp" / "notes.txt").write_text("mine")
    code = main(["run", "--nproc-per-node", "2", "--log-dir", "logs", "--workload", "gpt", "--experiment-dir", "exp"])
    assert code == 2 and "is not a trainscale experiment" in capsys.readouterr().err
    assert sorted(p.name for p in (in_tmp / "exp").iterdir()) == ["notes.txt"]
    assert not (in_tmp / "logs").exists()


def test_the_loop_reads_losses_back_once_per_log_line_not_every_micro_step(in_tmp, monkeypatch):
    """float(loss) waits for the GPU; every micro-step it stalled the pipeline. Counted here: reads of
    a tensor's value made by the training loop itself (the one narrow instrument)."""

    import torch

    from trainscale.train import loop, metrics
    from trainscale.workloads import gpt

    reads = []

    def counting(name):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            if sys._getframe(1).f_code.co_filename in (loop.__file__, metrics.__file__):
                reads.append(sys._getframe(1).f_code.co_name)
            return original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, read)

    for name in ("__float__", "item", "tolist"):
        counting(name)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(in_tmp / "inductor"))
    result = gpt.main(
        [
            "--max-steps",
            "8",
            "--grad-accum",
            "2",
            "--batch-size",
            "4",
            "--experiment-dir",
            "exp",
            "--tracker",
            "csv",
            *SMALL[:-2],
            "--log-every",
            "4",
        ]
    )
    assert result["steps"] == 8
    assert 1 <= len(reads) <= 3, reads  # steps 4 and 8 (16 micro-steps read 16 times before)
    state = json.loads((in_tmp / "exp" / "state.json").read_text())
    logged = _csv_steps(in_tmp / "exp" / "metrics.csv")
    assert [step for step, _ in logged] == list(range(1, 9))  # every step, read in blocks
    assert state["step"] == 8 and state["loss"] == pytest.approx(logged[-1][1])
