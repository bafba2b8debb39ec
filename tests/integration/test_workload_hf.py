"""hf-finetune (seeds 000/001): the HF Trainer under trainscale's launch, offline, on 2 gloo ranks."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from trainscale.cli.main import main

pytest.importorskip("transformers", reason="the hf-finetune workload needs transformers (pip install 'trainscale[lm]')")

RUN = ["run", "--nproc-per-node", "2", "--log-dir", "logs", "--workload", "hf-finetune"]


def test_trainer_runs_data_parallel_logs_to_the_trackers_and_resumes_the_output_dir_it_wrote(in_tmp, capsys):
    common = [
        *RUN,
        "--global-batch",
        "8",
        "--checkpoint-every",
        "2",
        "--output-dir",
        "out",
        "--log-every",
        "2",
        "--tracker",
        "csv",
    ]
    assert main([*common, "--max-steps", "4"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    code = main([*common, "--max-steps", "8", "--metrics-out", "m.json"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "resuming from out/checkpoint-4" in out.out
    metrics = json.loads((in_tmp / "m.json").read_text())
    assert metrics["world_size"] == 2 and metrics["per_device_batch"] == 4 and metrics["steps"] == 8
    assert metrics["model"] == "DistributedDataParallel" and metrics["train_loss"] > 0
    assert (in_tmp / "out" / "trainscale-hf.json").exists()
    assert {"checkpoint-6", "checkpoint-8"} <= {p.name for p in (in_tmp / "out").glob("checkpoint-*")}
    # the Trainer's log records reach the trackers through rt.log (rank 0 writes), in its output directory;
    # the resumed run appends to the same file
    rows = (in_tmp / "out" / "metrics.csv").read_text().splitlines()
    assert [r.split(",")[0] for r in rows if ",train/loss," in r] == ["2", "4", "6", "8"], rows


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
def test_deepspeed_strategy_is_run_by_the_trainer(in_tmp, capsys):
    code = main(
        [
            *RUN,
            "--strategy",
            "deepspeed:stage=2",
            "--max-steps",
            "4",
            "--global-batch",
            "8",
            "--output-dir",
            "out",
            "--metrics-out",
            "m.json",
        ]
    )
    assert code == 0, capsys.readouterr().err
    metrics = json.loads((in_tmp / "m.json").read_text())
    assert metrics["model"] == "DeepSpeedEngine" and metrics["steps"] == 4 and metrics["per_device_batch"] == 4


# What `from_pretrained` finds on a hub, made offline: a tokenizer trained with `tokenizers` on the
# review text and a tiny GPT-Neo with its vocabulary, both saved with save_pretrained. Built in a
# subprocess: importing transformers sets environment variables in the importing process.
MAKE_PRETRAINED = """
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import GPTNeoForCausalLM, PreTrainedTokenizerFast
from trainscale.workloads.hf_finetune import review_corpus, tiny_config

bpe = Tokenizer(models.BPE())
bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
bpe.decoder = decoders.ByteLevel()
bpe.train_from_iterator(review_corpus(300), trainers.BpeTrainer(
    vocab_size=320, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
tokenizer.save_pretrained(sys.argv[1])
GPTNeoForCausalLM(tiny_config(vocab_size=len(tokenizer))).save_pretrained(sys.argv[1])
# + one end-of-text token after each review
print(sum(len(ids) + 1 for ids in tokenizer(review_corpus())["input_ids"]))
"""


def test_pretrained_model_and_its_tokenizer_are_used(in_tmp, capsys):
    made = subprocess.run(
        [sys.executable, "-c", MAKE_PRETRAINED, str(in_tmp / "model")],
        capture_output=True,
        text=True,
        env=dict(os.environ),
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    n_tokens = int(made.stdout.split()[-1])
    code = main(
        [
            *RUN,
            "--pretrained",
            str(in_tmp / "model"),
            "--max-steps",
            "3",
            "--global-batch",
            "4",
            "--block-size",
            "32",
            "--output-dir",
            "out",
            "--metrics-out",
            "m.json",
        ]
    )
    assert code == 0, capsys.readouterr().err
    metrics = json.loads((in_tmp / "m.json").read_text())
    assert metrics["steps"] == 3 and metrics["blocks"] == n_tokens // 32  # BPE tokens, not bytes


def test_global_batch_that_does_not_split_is_refused_before_launch(in_tmp, capsys):
    code = main([*RUN, "--global-batch", "7"])
    err = capsys.readouterr().err
    assert code == 2 and "--global-batch 7 does not split evenly over 2 rank(s)" in err
    assert not (in_tmp / "logs").exists()


def test_per_rank_batch_size_option_is_refused_for_the_global_batch(in_tmp, capsys):
    code = main([*RUN, "--batch-size", "4"])
    assert code == 2 and "not --batch-size" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("strategy", "message", "hint"),
    [
        ("zero1", "has no HF Trainer integration", "--strategy deepspeed:stage=1"),
        ("fsdp", "needs GPUs", "--strategy deepspeed:stage=3"),
    ],
)
def test_strategies_the_trainer_cannot_run_are_refused_before_launch(in_tmp, capsys, strategy, message, hint):
    code = main([*RUN, "--strategy", strategy, "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and hint in err
    assert not (in_tmp / "logs").exists()


def test_foreign_output_dir_is_refused_untouched(in_tmp, capsys):
    (in_tmp / "out").mkdir()
    (in_tmp / "out" / "notes.txt").write_text("mine")
    code = main([*RUN, "--output-dir", "out"])
    assert code == 2 and "was not written by trainscale" in capsys.readouterr().err
    assert [p.name for p in (in_tmp / "out").iterdir()] == ["notes.txt"]


def test_bench_sizes_the_trainer_by_its_global_batch_and_records_every_step(in_tmp, capsys):
    code = main(
        [
            "bench",
            "--workload",
            "hf-finetune",
            "--configs",
            "1,2",
            "--batch-size",
            "2",
            "--max-steps",
            "4",
            "--epochs",
            "1",
            "--no-plots",
            "--out",
            "study",
        ]
    )
    assert code == 0, capsys.readouterr().err
    one, two = json.loads((in_tmp / "study" / "results.json").read_text())["runs"]
    assert (one["status"], two["status"]) == ("ok", "ok")
    # batch 2 per rank: the Trainer got --global-batch 2 on one rank and 4 on two, and the study kept the
    # work equal (half the steps on two ranks); the workload's own step count is what was recorded
    assert (one["global_batch"], two["global_batch"]) == (2, 4)
    assert (one["steps"], one["samples"], two["steps"], two["samples"]) == (4, 8, 2, 8)
    # a speedup above what two ranks on these cores allow (the machine shared with other work) is kept
    # apart as rejected, never shown as a result: either way it is the ratio of the two throughputs
    speedup = two["speedup"] if two["speedup"] is not None else two["rejected"]["speedup"]
    assert speedup == pytest.approx(two["samples"] / two["runtime_s"] / (one["samples"] / one["runtime_s"]))
