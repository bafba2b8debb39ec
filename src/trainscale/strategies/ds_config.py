"""DeepSpeed configuration: read the user's ``ds_config.json``, build one from trainscale's options,
and validate either before anything is launched. Pure functions; DeepSpeed itself is not imported.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from trainscale.errors import ConfigError

STAGES = (0, 1, 2, 3)
PRECISIONS = ("fp32", "bf16", "fp16")
BATCH_KEYS = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:  # DeepSpeed refuses them too (dict_raise_error_on_duplicate_keys)
        raise ValueError(f"duplicate key(s) {', '.join(map(repr, dup))}")
    return dict(pairs)


def parse_ds_config(text: str, origin: str) -> dict[str, Any]:
    """A ds_config as DeepSpeed reads it: hjson (JSON plus trailing commas, comments, unquoted keys),
    duplicate keys refused. Plain JSON parsing when hjson (a DeepSpeed dependency) is not installed."""
    try:
        from hjson import loads  # noqa: PLC0415 (optional dependency)
    except ImportError:  # pragma: no cover - hjson comes with deepspeed and the test extra
        from json import loads  # noqa: PLC0415 (optional dependency)
    try:
        config = loads(text, object_pairs_hook=_no_duplicates)
    except ValueError as exc:  # hjson.HjsonDecodeError and json.JSONDecodeError are ValueErrors
        raise ConfigError(
            f"DeepSpeed config {origin} cannot be read as DeepSpeed reads it (hjson): {exc}",
            hint="check brackets, quotes and colons near the position named; trailing commas and comments are fine",
        ) from None
    if not isinstance(config, dict):
        raise ConfigError(
            f"DeepSpeed config {origin} holds a {type(config).__name__}, not an object",
            hint='it should look like {"train_micro_batch_size_per_gpu": 16, ...}',
        )
    return config


def load_ds_config(path: str | Path) -> dict[str, Any]:
    """The config in ``path``, read as DeepSpeed reads it; ConfigError names the file and the problem."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(
            f"DeepSpeed config {path} does not exist",
            hint="give the path of your ds_config.json, or leave it out to build one from "
            "--batch-size and the strategy options",
        ) from None
    return parse_ds_config(text, str(path))


def check_user_config_file(path: str | Path, world_size: int, *, device: str | None = None) -> dict[str, Any]:
    """A script's own ``--deepspeed_config FILE``, checked before launch as DeepSpeed will check it at
    ``deepspeed.initialize``: readable, a ZeRO stage, batch sizes that fit ``world_size`` ranks."""
    return validate_ds_config(load_ds_config(path), world_size, device=device)


def build_ds_config(
    *,
    micro_batch_size: int,
    gradient_accumulation_steps: int = 1,
    stage: int = 3,
    precision: str = "fp32",
    optimizer: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A ds_config from trainscale's options. Without ``optimizer`` the training script's own torch
    optimizer is used (no DeepSpeed fused-op compile on first start)."""
    config: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": gradient_accumulation_steps,
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": precision == "bf16"},
        "fp16": {"enabled": precision == "fp16"},
        "zero_allow_untested_optimizer": True,  # any torch optimizer; DeepSpeed only lists a few as tested
        # DeepSpeed clips the gradients' norm at 1.0 unless told otherwise; ddp, zero1 and fsdp do not, and the
        # same script must train the same model under each (a script that clips does so itself)
        "gradient_clipping": 0.0,
        "steps_per_print": 2**31 - 1,  # trainscale prints progress itself
    }
    if optimizer is not None:
        config["optimizer"] = optimizer
    return config


def _positive_int(config: dict[str, Any], key: str) -> int | None:
    value = config.get(key)
    if value is None or value == "auto":  # "auto" is filled in by the HF integration, not by DeepSpeed
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"ds_config {key}={value!r} must be a positive integer", hint=f'e.g. "{key}": 16')
    return value


def _check_batch(config: dict[str, Any], world_size: int, micro_option: str | None = None) -> None:
    """Fill in the three batch sizes DeepSpeed relates as train = micro x accumulation x world size.
    ``micro_option``: the command-line option the per-rank batch came from (named in the hints)."""
    train, micro, accum = (_positive_int(config, k) for k in BATCH_KEYS)

    def or_option(fits: int) -> str:
        return f", or {micro_option} {fits}" if micro_option else ""

    rule = "train_batch_size = train_micro_batch_size_per_gpu x gradient_accumulation_steps x world size"
    if train is None and micro is None:
        raise ConfigError(
            "ds_config sets neither train_batch_size nor train_micro_batch_size_per_gpu",
            hint='add "train_micro_batch_size_per_gpu": <per-rank batch>',
        )
    if train is not None and micro is not None and accum is not None:
        if train != micro * accum * world_size:
            raise ConfigError(
                f"ds_config train_batch_size={train}, but train_micro_batch_size_per_gpu={micro} x "
                f"gradient_accumulation_steps={accum} x world size {world_size} = {micro * accum * world_size}",
                hint=f"{rule}; with {world_size} rank(s) set train_batch_size to {micro * accum * world_size}"
                + (
                    (
                        f" (or train_micro_batch_size_per_gpu to {train // (accum * world_size)})"
                        if not micro_option
                        else or_option(train // (accum * world_size))
                    )
                    if train % (accum * world_size) == 0
                    else ""
                )
                + ', or set it to "auto"/drop it and let DeepSpeed compute it',
            )
    elif train is not None and micro is not None:
        if train % (micro * world_size):
            raise ConfigError(
                f"ds_config train_batch_size={train} is not a multiple of train_micro_batch_size_per_gpu={micro} "
                f"x world size {world_size}",
                hint=f"{rule}; use a multiple of {micro * world_size}"
                + (or_option(train // world_size) if train % world_size == 0 else ""),
            )
        accum = train // (micro * world_size)
    elif train is not None:
        accum = accum or 1
        if train % (accum * world_size):
            raise ConfigError(
                f"ds_config train_batch_size={train} cannot be split over {world_size} rank(s) x "
                f"gradient_accumulation_steps={accum}",
                hint=f"{rule}; use a multiple of {accum * world_size}",
            )
        micro = train // (accum * world_size)
    else:
        accum = accum or 1
        train = micro * accum * world_size
    config.update(train_batch_size=train, train_micro_batch_size_per_gpu=micro, gradient_accumulation_steps=accum)


def validate_ds_config(
    config: dict[str, Any], world_size: int, *, device: str | None = None, micro_option: str | None = None
) -> dict[str, Any]:
    """Check a ds_config before launch and return a copy with the batch sizes made consistent.

    ``device``: "cpu", "cuda" or None/"auto" (a GPU when one is visible). Raises ConfigError for an
    unknown ZeRO stage, batch sizes that do not fit the world size, fp16 on CPU, or fp16 with bf16.
    ``micro_option``: the option the per-rank batch came from (``--batch-size``), offered as a fix.
    """
    if world_size < 1:
        raise ConfigError(f"world size {world_size} must be >= 1", hint="count every rank of the job")
    config = copy.deepcopy(config)
    zero = config.get("zero_optimization", {})
    if not isinstance(zero, dict):
        raise ConfigError(f"ds_config zero_optimization is {zero!r}, not an object", hint='e.g. {"stage": 2}')
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or stage not in STAGES:
        raise ConfigError(
            f"ds_config zero_optimization.stage={stage!r} is not a ZeRO stage",
            hint="use 0 (off), 1 (optimizer state), 2 (+ gradients) or 3 (+ parameters)",
        )
    _check_batch(config, world_size, micro_option)
    fp16 = bool(config.get("fp16", {}).get("enabled", False))
    bf16 = bool(config.get("bf16", config.get("bfloat16", {})).get("enabled", False))
    if fp16 and bf16:
        raise ConfigError("ds_config enables both fp16 and bf16", hint="enable one of them")
    if fp16 and _resolve_device(device) == "cpu":
        raise ConfigError(
            "ds_config enables fp16, but this run is on the CPU, where DeepSpeed has no fp16 loss scaling kernels",
            hint='set "fp16": {"enabled": false} (and "bf16": {"enabled": true} for half precision), or run on GPUs',
        )
    return config


def _resolve_device(device: str | None) -> str:
    if device in (None, "auto"):
        import torch  # noqa: PLC0415 (torch-free module)

        return "cuda" if torch.cuda.is_available() else "cpu"
    return str(device).split(":")[0]
