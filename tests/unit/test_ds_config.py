"""DeepSpeed configs are checked before launch (no DeepSpeed import, no process group), and strategy
option strings turn into typed strategy options."""

from __future__ import annotations

import importlib.util
import json

import pytest

from trainscale.errors import ConfigError
from trainscale.strategies import check_strategy, get_strategy, parse_spec
from trainscale.strategies.ds_config import build_ds_config, load_ds_config, validate_ds_config

HAS_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None


def seed_config(**changes):
    """The shape of seed 002's ds_config.json."""
    config = {
        "train_batch_size": 32,
        "train_micro_batch_size_per_gpu": 8,
        "gradient_accumulation_steps": 2,
        "fp16": {"enabled": False},
        "zero_optimization": {"stage": 2},
    }
    config.update(changes)
    return config


def test_consistent_config_passes_and_is_not_mutated():
    config = seed_config()
    out = validate_ds_config(config, world_size=2, device="cpu")
    assert out == config and out is not config


@pytest.mark.parametrize(
    "given,world,expected",
    [
        ({"train_micro_batch_size_per_gpu": 8}, 4, (32, 8, 1)),
        ({"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 3}, 2, (48, 8, 3)),
        ({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8}, 2, (64, 8, 4)),
        ({"train_batch_size": 64}, 4, (64, 16, 1)),
        ({"train_batch_size": 64, "gradient_accumulation_steps": 2}, 4, (64, 8, 2)),
    ],
)
def test_batch_sizes_are_completed(given, world, expected):
    out = validate_ds_config(given, world_size=world, device="cpu")
    assert (
        out["train_batch_size"],
        out["train_micro_batch_size_per_gpu"],
        out["gradient_accumulation_steps"],
    ) == expected


def test_batch_size_inconsistent_with_world_size():
    with pytest.raises(ConfigError) as err:
        validate_ds_config(seed_config(), world_size=4, device="cpu")  # 8 x 2 x 4 = 64, not 32
    text = str(err.value)
    assert "train_batch_size=32" in text and "= 64" in text and "set train_batch_size to 64" in text


@pytest.mark.parametrize(
    "config,world,needle",
    [
        ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 8}, 2, "not a multiple"),
        ({"train_batch_size": 30}, 4, "cannot be split over 4 rank(s)"),
        ({"gradient_accumulation_steps": 2}, 2, "neither train_batch_size nor"),
        ({"train_micro_batch_size_per_gpu": 0}, 2, "must be a positive integer"),
        ({"train_micro_batch_size_per_gpu": "16"}, 2, "must be a positive integer"),
    ],
)
def test_bad_batch_settings(config, world, needle):
    with pytest.raises(ConfigError, match=None) as err:
        validate_ds_config(config, world_size=world, device="cpu")
    assert needle in str(err.value)
    assert err.value.hint


@pytest.mark.parametrize("stage", [4, -1, "2", True, None])
def test_unknown_zero_stage(stage):
    with pytest.raises(ConfigError) as err:
        validate_ds_config(seed_config(zero_optimization={"stage": stage}), world_size=2, device="cpu")
    assert "zero_optimization.stage" in str(err.value) and "3 (+ parameters)" in err.value.hint


def test_fp16_on_cpu_is_refused_but_fine_on_gpu():
    config = seed_config(fp16={"enabled": True})
    with pytest.raises(ConfigError) as err:
        validate_ds_config(config, world_size=2, device="cpu")
    assert "fp16" in str(err.value) and "bf16" in err.value.hint
    assert validate_ds_config(config, world_size=2, device="cuda")["fp16"]["enabled"] is True
    with pytest.raises(ConfigError, match="both fp16 and bf16"):
        validate_ds_config(seed_config(fp16={"enabled": True}, bf16={"enabled": True}), world_size=2, device="cuda")


def test_built_config_validates_and_uses_the_script_optimizer():
    config = build_ds_config(micro_batch_size=16, gradient_accumulation_steps=2, stage=3, precision="bf16")
    out = validate_ds_config(config, world_size=2, device="cpu")
    assert out["train_batch_size"] == 64 and out["zero_optimization"] == {"stage": 3}
    assert out["bf16"]["enabled"] and not out["fp16"]["enabled"] and "optimizer" not in out


def test_load_ds_config_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_ds_config(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"train_batch_size": 8 "stage": 1}')
    with pytest.raises(ConfigError, match="cannot be read as DeepSpeed reads it"):
        load_ds_config(bad)
    bad.write_text('{"train_batch_size": 8, "train_batch_size": 16}')
    with pytest.raises(ConfigError, match="duplicate key"):
        load_ds_config(bad)
    bad.write_text("[1, 2]")
    with pytest.raises(ConfigError, match="not an object"):
        load_ds_config(bad)
    good = tmp_path / "ds_config.json"
    good.write_text(json.dumps(seed_config()))
    assert load_ds_config(good) == seed_config()


def test_strategy_spec_strings():
    assert parse_spec("FSDP:reshard_after_forward=false, mixed_precision=bf16") == (
        "fsdp",
        {"reshard_after_forward": "false", "mixed_precision": "bf16"},
    )
    fsdp = get_strategy("fsdp:reshard_after_forward=false,mixed_precision=bf16,unit_modules=Block+Embed")
    assert fsdp.reshard_after_forward is False and fsdp.mixed_precision == "bf16"
    assert fsdp.unit_modules == ("Block", "Embed")
    assert get_strategy("zero1:bucket_cap_mb=50").bucket_cap_mb == 50.0
    with pytest.raises(ConfigError) as err:
        get_strategy("fsdp:reshard=false")
    assert "reshard_after_forward" in err.value.hint
    with pytest.raises(ConfigError, match="not a boolean"):
        get_strategy("fsdp:cpu_offload=maybe")
    with pytest.raises(ConfigError, match="not key=value"):
        get_strategy("fsdp:bf16")
    with pytest.raises(ConfigError, match="mixed_precision"):
        get_strategy("fsdp:mixed_precision=fp8")


@pytest.mark.skipif(not HAS_DEEPSPEED, reason="deepspeed is not installed (pip install 'trainscale[deepspeed]')")
def test_preflight_reads_the_users_ds_config(tmp_path):
    path = tmp_path / "ds_config.json"
    path.write_text(json.dumps(seed_config()))
    check_strategy(f"deepspeed:config={path}", world_size=2, batch_size=8, device="cpu")
    with pytest.raises(ConfigError, match="world size 4") as err:
        check_strategy(f"deepspeed:config={path}", world_size=4, batch_size=8, device="cpu")
    assert "--batch-size 4" in err.value.hint  # the per-rank batch that fits the file's train_batch_size
    with pytest.raises(ConfigError) as err:  # --batch-size disagrees with the file
        check_strategy(f"deepspeed:config={path}", world_size=2, batch_size=16, device="cpu")
    assert "--batch-size 8" in err.value.hint
    path.write_text(json.dumps(seed_config(zero_optimization={"stage": 5})))
    with pytest.raises(ConfigError, match="not a ZeRO stage"):
        check_strategy(f"deepspeed:config={path}", world_size=2, device="cpu")
    built = get_strategy("deepspeed:stage=2,gradient_accumulation_steps=2", micro_batch_size=4)
    assert built.ds_config(world_size=2, device="cpu")["train_batch_size"] == 16
    with pytest.raises(ConfigError, match="not a ZeRO stage"):
        get_strategy("deepspeed:stage=7")


SEED_002_CONFIG = """{
  "zero_optimization": {
    "stage": 1
  },

  "fp16": {
    "enabled": false,
  }
}
"""


def test_config_with_trailing_comma_as_deepspeed_reads_it(tmp_path):
    # Seed 002's ds_config.json, trailing comma and all: DeepSpeed reads configs with hjson and accepts it.
    path = tmp_path / "ds_config.json"
    path.write_text(SEED_002_CONFIG)
    assert load_ds_config(path) == {"zero_optimization": {"stage": 1}, "fp16": {"enabled": False}}
    path.write_text(
        '{\n  // comments too\n  train_micro_batch_size_per_gpu: 4\n  gradient_accumulation_steps: "auto",\n}'
    )
    assert load_ds_config(path) == {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": "auto"}


def test_script_deepspeed_config_checked_before_launch_with_the_arithmetic(tmp_path):
    from trainscale.launch.preflight import check_script_args

    path = tmp_path / "ds_config.json"
    path.write_text('{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,}')
    check_script_args(["--deepspeed", "--deepspeed_config", str(path)], world_size=8)  # 4 x 1 x 8 = 32
    with pytest.raises(ConfigError) as err:
        check_script_args(["--deepspeed", f"--deepspeed_config={path}"], world_size=4)
    text = str(err.value)
    assert "train_batch_size=32" in text and "= 16" in text
    assert "train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size" in text
    assert "set train_batch_size to 16" in text and "train_micro_batch_size_per_gpu to 8" in text
    check_script_args(["--lr", "1e-3"], world_size=4)  # no DeepSpeed config: nothing to check
