"""A workload's own options (gpt's --seq-len, vit's --width, hf-finetune's --global-batch) resolve in the one order
with the common ones: the same [train] table and TRAINSCALE_TRAIN_ variables, and a name that neither the common
options nor this workload's own has is refused (issue 23 item 2)."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from trainscale.errors import ConfigError
from trainscale.train.options import TrainOptions, add_common_arguments, options_from_args, parse
from trainscale.workloads import cnn, gpt, hf_finetune, vit


def _config(tmp_path, text: str) -> str:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return str(path)


def test_gpt_takes_its_own_options_from_the_config_file_the_environment_and_the_command_line(tmp_path):
    job = _config(tmp_path, "[train]\nseq_len = 64\nn_layer = 2\nbatch_size = 4\n")

    def resolved(argv, environ):
        return parse(argv, prog="t", defaults=gpt.DEFAULTS, workload=gpt.GPTOptions, environ=environ)

    assert resolved([], {})[1].seq_len == 128  # the dataclass's default
    opts, own = resolved(["--config", job], {})
    assert (own.seq_len, own.n_layer, opts.batch_size, opts.lr) == (64, 2, 4, gpt.DEFAULTS.lr)
    environ = {"TRAINSCALE_TRAIN_SEQ_LEN": "32", "TRAINSCALE_TRAIN_HUB_DATASET": "imdb"}
    own = resolved(["--config", job], environ)[1]
    assert (own.seq_len, own.n_layer, own.hub_dataset) == (32, 2, "imdb")  # the environment beats the file
    own = resolved(["--config", job, "--seq-len", "16"], environ)[1]
    assert (own.seq_len, own.n_layer) == (16, 2)  # the command line beats both
    assert dataclasses.is_dataclass(own) and isinstance(own, gpt.GPTOptions)
    with pytest.raises(dataclasses.FrozenInstanceError):
        own.seq_len = 8  # type: ignore[misc]


def test_a_workload_option_is_validated_wherever_it_came_from(tmp_path):
    with pytest.raises(ConfigError, match="--seq-len 1 must be >= 2"):
        gpt.preflight(["--config", _config(tmp_path, "[train]\nseq_len = 1\n")], 1)
    with pytest.raises(ConfigError, match="--n-embd 30 is not divisible by --n-head 4"):
        parse([], prog="t", workload=gpt.GPTOptions, environ={"TRAINSCALE_TRAIN_N_EMBD": "30"})
    with pytest.raises(ConfigError, match="--width 30 is not divisible by --heads 4"):
        parse([], prog="t", workload=vit.ViTOptions, environ={"TRAINSCALE_TRAIN_WIDTH": "30"})
    with pytest.raises(ConfigError, match="environment TRAINSCALE_TRAIN_SEQ_LEN: seq_len='long' is not a valid int"):
        parse([], prog="t", workload=gpt.GPTOptions, environ={"TRAINSCALE_TRAIN_SEQ_LEN": "long"})


def test_another_workloads_option_is_refused_with_the_valid_names(tmp_path, monkeypatch):
    job = _config(tmp_path, "[train]\nseq_len = 64\n")
    with pytest.raises(ConfigError, match="config file: unknown train option 'seq_len'") as caught:
        cnn.preflight(["--config", job], 1)
    assert "batch_size" in caught.value.hint and "seq_len" not in caught.value.hint
    with pytest.raises(ConfigError, match="environment variable TRAINSCALE_TRAIN_SEQ_LEN names no train option"):
        parse([], prog="t", environ={"TRAINSCALE_TRAIN_SEQ_LEN": "64"})
    with pytest.raises(ConfigError, match="unknown train option 'seq_len'"):
        parse(["--config", job], prog="t", workload=vit.ViTOptions, environ={})
    with pytest.raises(ConfigError, match="unknown train option 'seq_lem'") as caught:
        parse(["--config", _config(tmp_path, "[train]\nseq_lem = 64\n")], prog="t", workload=gpt.GPTOptions)
    assert "did you mean 'seq_len'" in caught.value.hint


def test_hf_finetune_takes_its_global_batch_from_the_config_file(tmp_path):
    job = _config(tmp_path, '[train]\nglobal_batch = 8\noutput_dir = "out"\n')
    plan = hf_finetune.plan(["--config", job], 2, gpus=False)
    assert (plan.own.global_batch, plan.per_device, plan.own.output_dir) == (8, 4, "out")


def test_no_workload_option_shares_a_name_with_a_common_one():
    common = {f.name for f in dataclasses.fields(TrainOptions)}
    for options in (gpt.GPTOptions, vit.ViTOptions, hf_finetune.HFOptions):
        assert not common & {f.name for f in dataclasses.fields(options)}, options


def test_the_namespace_is_left_as_argparse_made_it():
    """Workloads read the options objects; the namespace holds only what was typed."""
    parser = argparse.ArgumentParser()
    add_common_arguments(parser)
    args = parser.parse_args(["--lr", "0.5"])
    opts, own = options_from_args(args, TrainOptions(epochs=2), environ={})
    assert (opts.lr, opts.epochs, own) == (0.5, 2, None)
    assert vars(args) == {"config": None, "lr": 0.5}
