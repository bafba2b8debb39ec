"""defaults < profile < config file < environment < command line, with errors that name the fix."""

from __future__ import annotations

import importlib.util

import pytest

from trainscale.config import load_config_file, resolve
from trainscale.errors import ConfigError
from trainscale.train.options import TrainOptions


def test_each_source_overrides_the_one_before(tmp_path):
    cfg = tmp_path / "job.toml"
    cfg.write_text("[train]\nbatch_size = 32\nlr = 0.01\nepochs = 3\n")
    opts, origin = resolve(
        TrainOptions,
        section="train",
        config=load_config_file(cfg),
        environ={"TRAINSCALE_TRAIN_LR": "0.5", "TRAINSCALE_TRAIN_EPOCHS": "4"},
        cli={"epochs": 7, "seed": None},
    )
    assert (opts.batch_size, opts.lr, opts.epochs, opts.seed) == (32, 0.5, 7, 0)
    assert origin == {"batch_size": "config file", "epochs": "command line", "lr": "environment"}


def test_environment_strings_are_typed():
    opts, _ = resolve(
        TrainOptions,
        section="train",
        environ={"TRAINSCALE_TRAIN_SHUFFLE": "false", "TRAINSCALE_TRAIN_MAX_STEPS": "none"},
    )
    assert opts.shuffle is False and opts.max_steps is None


def test_unknown_key_in_config_file_lists_valid_ones(tmp_path):
    cfg = tmp_path / "job.toml"
    cfg.write_text("[train]\nbatch_sise = 32\n")
    with pytest.raises(ConfigError, match="did you mean 'batch_size'"):
        resolve(TrainOptions, section="train", config=load_config_file(cfg))


def test_bad_environment_value_names_the_variable():
    with pytest.raises(ConfigError, match="TRAINSCALE_TRAIN_EPOCHS"):
        resolve(TrainOptions, section="train", environ={"TRAINSCALE_TRAIN_EPOCHS": "many"})


def test_validation_still_applies_after_merging():
    with pytest.raises(ConfigError, match="--batch-size 0"):
        resolve(TrainOptions, section="train", cli={"batch_size": 0})


def test_invalid_toml_and_missing_file(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config_file(bad)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config_file(tmp_path / "nope.toml")


def test_mapping_fields_from_the_environment():
    from trainscale.launch.slurm import SlurmJobSpec

    spec, origin = resolve(
        SlurmJobSpec,
        section="slurm",
        environ={"TRAINSCALE_SLURM_ENV": "A=1,B=x=y", "TRAINSCALE_SLURM_MODULES": "load a,load b"},
        cli={"script": "t.py", "time": "5"},
    )
    assert spec.env == {"A": "1", "B": "x=y"} and spec.modules == ("load a", "load b")
    assert origin["env"] == "environment"
    with pytest.raises(ConfigError, match="is not a valid KEY=VALUE"):
        resolve(
            SlurmJobSpec,
            section="slurm",
            environ={"TRAINSCALE_SLURM_ENV": "novalue"},
            cli={"script": "t.py", "time": "5"},
        )


def test_a_required_option_no_source_gave_is_a_typed_error():
    """The CLI tells which option is missing from the error's field, not from its text (issue 23)."""
    import dataclasses

    from trainscale.errors import MissingOption

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Job:
        time: str
        """Time limit."""
        nodes: int = 1
        """Nodes."""

    with pytest.raises(MissingOption) as missing:
        resolve(Job, section="slurm", environ={}, cli={"nodes": 2})
    assert (missing.value.section, missing.value.option) == ("slurm", "time")
    assert "TRAINSCALE_SLURM_TIME" in missing.value.hint
    assert resolve(Job, section="slurm", environ={"TRAINSCALE_SLURM_TIME": "5"}, cli={})[0].time == "5"


def test_variables_and_strategy_options_convert_alike_each_with_its_separator():
    """One converter (trainscale/convert.py): a strategy spec joins several values with + because , separates
    its options; a TRAINSCALE_ variable uses ,. A field that takes a number or a word takes both from either."""
    import dataclasses

    from trainscale.convert import convert
    from trainscale.strategies import get_strategy

    assert (
        convert("Block,Head", tuple[str, ...]) == convert("Block+Head", tuple[str, ...], sep="+") == ("Block", "Head")
    )
    assert get_strategy("fsdp:unit_modules=Block+Head").unit_modules == ("Block", "Head")

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class Comm:
        bucket_cap_mb: float | str = "auto"
        """MiB or auto."""
        hook: str | None = "auto"
        """A hook, or none."""

    assert resolve(Comm, section="ddp", environ={"TRAINSCALE_DDP_BUCKET_CAP_MB": "auto"})[0].bucket_cap_mb == "auto"
    comm, _ = resolve(
        Comm, section="ddp", environ={"TRAINSCALE_DDP_BUCKET_CAP_MB": "2.5", "TRAINSCALE_DDP_HOOK": "none"}
    )
    assert (comm.bucket_cap_mb, comm.hook) == (2.5, None)
    assert get_strategy("ddp:bucket_cap_mb=2.5").bucket_cap_mb == 2.5 and get_strategy("ddp:bucket_cap_mb=auto")


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
def test_a_mapping_strategy_option_is_refused_from_a_string():
    from trainscale.strategies import get_strategy

    with pytest.raises(
        ConfigError, match="strategy option overrides takes a mapping, which a strategy string cannot give"
    ) as caught:
        get_strategy("deepspeed:overrides=steps_per_print=1")
    assert "get_strategy(..., overrides={...})" in caught.value.hint
    assert get_strategy("deepspeed", overrides={"steps_per_print": 1}).overrides == {"steps_per_print": 1}
