"""Parallel strategies behind one switch: ``get_strategy("ddp" | "zero1" | "fsdp" | "deepspeed")``."""

from __future__ import annotations

import importlib
from typing import Any

from trainscale.errors import ConfigError, did_you_mean
from trainscale.strategies.base import Strategy

# name -> (module, class). Modules are imported on demand: deepspeed is an optional extra.
REGISTRY: dict[str, tuple[str, str]] = {
    "ddp": ("trainscale.strategies.ddp", "DDPStrategy"),
    "zero1": ("trainscale.strategies.zero1", "Zero1Strategy"),
    "fsdp": ("trainscale.strategies.fsdp", "FSDPStrategy"),
    "deepspeed": ("trainscale.strategies.deepspeed", "DeepSpeedStrategy"),
}


def get_strategy(name: str | Strategy, **options: Any) -> Strategy:
    if not isinstance(name, str):
        return name
    key = name.strip().lower()
    if key not in REGISTRY:
        raise ConfigError(f"unknown strategy {name!r}", hint=did_you_mean(key, list(REGISTRY)))
    module_name, cls_name = REGISTRY[key]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise ConfigError(f"strategy {key!r} is not available in this build", hint="use --strategy ddp") from None
        raise ConfigError(f"strategy {key!r} needs the package {exc.name!r}",
                          hint=f"pip install 'trainscale[{key}]'") from None
    return getattr(module, cls_name)(**options)


__all__ = ["Strategy", "get_strategy", "REGISTRY"]
