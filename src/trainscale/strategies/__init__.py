"""Parallel strategies behind one switch: ``get_strategy("ddp" | "zero1" | "fsdp" | "deepspeed")``.

Options ride along in one string, so ``--strategy`` needs no other flags:
``fsdp:reshard_after_forward=false,mixed_precision=bf16`` or ``deepspeed:config=ds_config.json``.
"""

from __future__ import annotations

import dataclasses
import importlib
import typing
from typing import Any

from trainscale.convert import convert, kinds
from trainscale.errors import ConfigError, did_you_mean
from trainscale.runtime.device import MIXED_BACKEND
from trainscale.strategies.base import Strategy

# name -> (module, class). Modules are imported on demand: deepspeed is an optional extra.
REGISTRY: dict[str, tuple[str, str]] = {
    "ddp": ("trainscale.strategies.ddp", "DDPStrategy"),
    "zero1": ("trainscale.strategies.zero1", "Zero1Strategy"),
    "fsdp": ("trainscale.strategies.fsdp", "FSDPStrategy"),
    "deepspeed": ("trainscale.strategies.deepspeed", "DeepSpeedStrategy"),
}


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """``"name:key=value,key=value"`` -> (name, {key: value}) with the values still strings."""
    name, _, rest = spec.partition(":")
    options: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(
                f"strategy option {item!r} in {spec!r} is not key=value",
                hint="e.g. --strategy fsdp:reshard_after_forward=false,mixed_precision=bf16",
            )
        options[key.strip()] = value.strip()
    return name.strip().lower(), options


def _coerce(cls: type, options: dict[str, Any]) -> dict[str, Any]:
    """Turn option strings into the field types of the strategy dataclass; unknown names are errors."""
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init and f.name != "name"}
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for key, value in options.items():
        if key not in fields:
            raise ConfigError(
                f"strategy {cls.name!r} has no option {key!r}",  # type: ignore[attr-defined]
                hint=did_you_mean(key, list(fields)),
            )
        out[key] = _convert(key, value, hints[key]) if isinstance(value, str) else value
    return out


def _convert(key: str, value: str, hint: Any) -> Any:
    """A typed value, converted as a TRAINSCALE_ variable is (trainscale/convert.py) but with several values
    joined by ``+`` (``,`` separates the options); a field that also takes a word (``bucket_cap_mb: float | str``
    for ``auto``) keeps what is not a number or a boolean as the string, and the strategy validates it."""
    if any((typing.get_origin(kind) or kind) is dict for kind in kinds(hint)) and str not in kinds(hint):
        raise ConfigError(
            f"strategy option {key} takes a mapping, which a strategy string cannot give",
            hint=f"set {key} from Python (get_strategy(..., {key}={{...}})) or in the config= file",
        )
    try:
        return convert(value, hint, sep="+")
    except ValueError:
        if bool in kinds(hint):
            raise ConfigError(
                f"strategy option {key}={value!r} is not a boolean", hint=f"use {key}=true or {key}=false"
            ) from None
        raise ConfigError(f"strategy option {key}={value!r} is not a number", hint=f"e.g. {key}=1") from None


def get_strategy(name: str | Strategy, **options: Any) -> Strategy:
    """A strategy by name (or ``"name:key=value,..."``); keyword options override those in the string."""
    if not isinstance(name, str):
        return name
    key, spec_options = parse_spec(name)
    options = {**spec_options, **options}
    if key not in REGISTRY:
        raise ConfigError(f"unknown strategy {name!r}", hint=did_you_mean(key, list(REGISTRY)))
    module_name, cls_name = REGISTRY[key]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise ConfigError(f"strategy {key!r} is not available in this build", hint="use --strategy ddp") from None
        raise ConfigError(f"strategy {key!r} needs the package {exc.name!r}", hint=f"pip install {exc.name}") from None
    cls = getattr(module, cls_name)
    return cls(**_coerce(cls, options))


def check_strategy(
    spec: str,
    world_size: int,
    *,
    batch_size: int | None = None,
    device: str | None = None,
    accumulation: int | None = None,
    compile: bool = False,
) -> None:
    """Preflight: build the strategy from its spec and let it check its configuration for this world
    size (a ds_config's stage and batch sizes, static_graph with accumulation, ``--compile``, ...)
    before anything is launched."""
    strategy = get_strategy(spec)
    if batch_size is not None:
        strategy = strategy.with_batch(batch_size, accumulation)
    if compile:
        strategy.check_compile()
    preflight = getattr(strategy, "preflight", None)
    if preflight is not None:
        preflight(world_size, device)


def advice(spec: str, world_size: int, optimizer_share: float) -> str | None:
    """What to try for a run of ``spec`` on ``world_size`` ranks whose optimizer step took
    ``optimizer_share`` of the step (DDP: ZeRO-1 when the replicated step dominates), or None."""
    try:
        strategy = get_strategy(spec)
    except ConfigError:  # a study of a strategy this installation cannot build: nothing to suggest
        return None
    return strategy.advice(world_size, optimizer_share)


def process_group_backend(spec: str) -> str | None:
    """The backend ``trainscale.init`` should ask for so that ``spec`` works, or None for the device's
    default. FSDP with CPU offload keeps its shards on the host, and a gradient norm or a full state
    dict over them is a CPU collective: on GPUs the group needs gloo beside nccl."""
    strategy = get_strategy(spec)
    return MIXED_BACKEND if getattr(strategy, "cpu_offload", False) else None


__all__ = ["Strategy", "get_strategy", "check_strategy", "advice", "process_group_backend", "parse_spec", "REGISTRY"]


@dataclasses.dataclass(frozen=True)
class Sharding:
    """What each rank holds a 1/N share of under a strategy (ZeRO's accounting), and whether it keeps DDP's
    gradient buckets (a copy of the gradients): what ``trainscale plan`` needs to know of a strategy without
    building it (DeepSpeed need not be installed to plan for it)."""

    params: bool
    grads: bool
    optimizer: bool
    buckets: bool
    whole_tensors: bool = False
    """The optimizer state is divided in whole tensors (torch's ZeroRedundancyOptimizer), not split evenly."""


def state_sharding(spec: str) -> Sharding:
    """A strategy spec's :class:`Sharding`: ``deepspeed:stage=K`` by its stage (3 by default, as the strategy)."""
    name, options = parse_spec(spec)
    if name not in REGISTRY:
        raise ConfigError(f"unknown strategy {name!r}", hint=did_you_mean(name, list(REGISTRY)))
    if name == "deepspeed":
        stage = int(options.get("stage", 3))
        return Sharding(params=stage >= 3, grads=stage >= 2, optimizer=stage >= 1, buckets=False)
    return {
        "ddp": Sharding(False, False, False, True),
        "zero1": Sharding(False, False, True, True, True),
        "fsdp": Sharding(True, True, True, False),
    }.get(name, Sharding(False, False, False, False))
