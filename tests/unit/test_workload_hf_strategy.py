"""--strategy for the HF Trainer: which TrainingArguments each strategy becomes (pure, no launch)."""

from __future__ import annotations

import importlib.util
import json

import pytest

from trainscale.errors import ConfigError
from trainscale.strategies.hf_trainer import trainer_arguments


def test_ddp_options_become_the_trainers_ddp_arguments():
    args = trainer_arguments(
        "ddp:find_unused_parameters=true,bucket_cap_mb=50", world_size=2, per_device=4, use_cpu=True
    )
    assert args == {"ddp_find_unused_parameters": True, "ddp_bucket_cap_mb": 50}


def test_fsdp_on_gpus_becomes_fsdp2_per_block_with_mixed_precision():
    args = trainer_arguments(
        "fsdp:reshard_after_forward=false,mixed_precision=bf16", world_size=2, per_device=4, use_cpu=False
    )
    assert args["fsdp"] is True and args["bf16"] is True
    assert args["fsdp_config"]["version"] == 2 and args["fsdp_config"]["reshard_after_forward"] is False
    assert args["fsdp_config"]["transformer_layer_cls_to_wrap"] == ["GPTNeoBlock"]


def test_unknown_strategy_option_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="no option 'reshard'") as err:
        trainer_arguments("fsdp:reshard=false", world_size=2, per_device=4, use_cpu=False)
    assert "reshard_after_forward" in err.value.hint


deepspeed_only = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")


@deepspeed_only
def test_deepspeed_config_agrees_with_the_trainers_batch():
    args = trainer_arguments(
        "deepspeed:stage=3,gradient_accumulation_steps=2", world_size=2, per_device=4, use_cpu=True
    )
    config = args["deepspeed"]
    assert config["zero_optimization"]["stage"] == 3
    assert (
        config["train_micro_batch_size_per_gpu"],
        config["gradient_accumulation_steps"],
        config["train_batch_size"],
    ) == (4, 2, 16)
    assert args["gradient_accumulation_steps"] == 2 and args["bf16"] is False and args["fp16"] is False


@deepspeed_only
def test_users_ds_config_with_another_micro_batch_is_refused(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 16, "zero_optimization": {"stage": 2}}))
    with pytest.raises(ConfigError, match="per-device batch of 4"):
        trainer_arguments(f"deepspeed:config={path}", world_size=2, per_device=4, use_cpu=True)
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}}))
    config = trainer_arguments(f"deepspeed:config={path}", world_size=2, per_device=4, use_cpu=True)["deepspeed"]
    assert config["train_micro_batch_size_per_gpu"] == 4 and config["train_batch_size"] == 8


@pytest.mark.parametrize("option", ["static_graph=true", "gradient_as_bucket_view=false"])
def test_ddp_options_the_trainer_has_no_argument_for_are_refused(option):
    with pytest.raises(ConfigError, match="has no HF Trainer argument") as caught:
        trainer_arguments(f"ddp:{option}", world_size=2, per_device=4, use_cpu=True)
    assert "bucket_cap_mb" in caught.value.hint
