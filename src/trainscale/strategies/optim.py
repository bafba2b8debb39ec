"""The optimizer a strategy trains with, from what the user gave: a ready optimizer (built on the
model's parameters, parameter groups included) or a factory (``OptimizerSpec``, or any callable
params -> optimizer).

A ready optimizer is used as it is while its parameters are still the model's (DDP and DeepSpeed
move the model in place). A strategy that replaces the parameters (FSDP's sharded DTensors) or the
optimizer (ZeRO-1's partitioned one) rebuilds it from a :class:`Recipe`: the class, its defaults and
each group's options, with the parameters found again by name.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from trainscale.errors import ConfigError
from trainscale.strategies.base import OptimizerSource, OptimizerSpec


def parameter_names(model: nn.Module) -> dict[int, str]:
    """id(parameter) -> name, taken before a strategy wraps or shards the model."""
    return {id(p): name for name, p in model.named_parameters()}


@dataclass(frozen=True)
class Recipe:
    """How to build an optimizer again on other parameters."""

    cls: type
    defaults: dict[str, Any]
    """Constructor keyword arguments (those the class accepts)."""
    groups: tuple[tuple[tuple[str, ...], dict[str, Any]], ...] | None = None
    """(parameter names, options) per group; None: one group of all the parameters."""

    def params(self, model: nn.Module) -> Any:
        """The parameters of ``model`` (named as before wrapping) in this recipe's groups."""
        if self.groups is None:
            return list(model.parameters())
        named = dict(_named_as_before(model).named_parameters())
        return [{**options, "params": [named[n] for n in names]} for names, options in self.groups]

    def build(self, model: nn.Module) -> torch.optim.Optimizer:
        return self.cls(self.params(model), **self.defaults)


def recipe_of(optimizer: torch.optim.Optimizer, names: dict[int, str] | None = None) -> Recipe:
    """The recipe of a built optimizer; ``names`` (from :func:`parameter_names`) keeps its groups."""
    accepted = inspect.signature(type(optimizer)).parameters
    defaults = {k: v for k, v in optimizer.defaults.items() if k in accepted}
    if names is not None:
        unknown = [p for group in optimizer.param_groups for p in group["params"] if id(p) not in names]
        if unknown:
            raise ConfigError(
                f"the optimizer holds {len(unknown)} parameter(s) that are not the model's",
                hint="build it from the parameters of the model you pass to setup, e.g. "
                "torch.optim.AdamW(model.parameters(), lr=1e-3)",
            )
    if names is None:
        return Recipe(type(optimizer), defaults)
    groups = tuple((tuple(names[id(p)] for p in group["params"]), _options(group)) for group in optimizer.param_groups)
    if len(groups) == 1 and groups[0] == (tuple(names.values()), defaults):
        return Recipe(type(optimizer), defaults)  # every parameter in the model's order, the defaults: one plain list
    return Recipe(type(optimizer), defaults, groups)


def _options(group: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in group.items() if k != "params"}


def as_recipe(source: OptimizerSource, model: nn.Module, names: dict[int, str]) -> Recipe:
    """What ZeRO-1 needs: a class and its arguments. A plain factory is called once on the model's
    own parameters (optimizers allocate their state lazily, so this builds nothing big)."""
    if isinstance(source, OptimizerSpec):
        return Recipe(source.cls, dict(source.kwargs))
    built = source if isinstance(source, torch.optim.Optimizer) else source(list(model.parameters()))
    _check_fresh(built)
    return recipe_of(built, names if built is source else parameter_names(_named_as_before(model)))


def build_optimizer(source: OptimizerSource, model: nn.Module, names: dict[int, str]) -> torch.optim.Optimizer:
    """The optimizer for ``model`` (already wrapped or sharded); ``names`` were taken before that."""
    if not isinstance(source, torch.optim.Optimizer):
        return source(model.parameters())
    _check_fresh(source)
    mine = {id(p) for p in model.parameters()}
    if all(id(p) in mine for group in source.param_groups for p in group["params"]):
        return source  # still the model's own parameters
    return recipe_of(source, names).build(model)


def _named_as_before(model: nn.Module) -> nn.Module:
    return model.module if isinstance(getattr(model, "module", None), nn.Module) else model


def _check_fresh(optimizer: torch.optim.Optimizer) -> None:
    if optimizer.state:
        raise ConfigError(
            "the optimizer has stepped already: its state would not follow the model into the strategy",
            hint="call setup before the first optimizer step (load a checkpoint after it)",
        )
