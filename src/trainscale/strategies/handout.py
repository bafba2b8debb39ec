"""The optimizer a script gets back from ``rt.setup`` when a strategy must see its step: fp16 loss
scaling (the scaler steps and updates) and DeepSpeed (its engine steps). It *is* an optimizer of the
same class (an LR scheduler accepts it), and it *delegates* to the strategy's own optimizer rather
than copying it: ``param_groups``, ``state`` and ``defaults`` are properties that read and write the
inner optimizer's, and any other attribute is looked up there, so what a scheduler changes is what
trains even after ``load_state_dict`` gave the inner optimizer new parameter groups (a copy would
keep the old ones). Only ``step``, ``zero_grad``, ``state_dict`` and ``load_state_dict`` are routed,
as Lightning Fabric's wrapped optimizer does. Strategies whose step is the optimizer's own hand out
the optimizer itself.
"""

from __future__ import annotations

from typing import Any


def _forwarded(name: str) -> property:
    def get(self: Any) -> Any:
        return getattr(self._trainscale[0], name)

    def set_(self: Any, value: Any) -> None:
        setattr(self._trainscale[0], name, value)

    return property(get, set_, doc=f"The strategy's own optimizer's ``{name}``.")


class _ThroughStrategy:
    param_groups = _forwarded("param_groups")
    state = _forwarded("state")
    defaults = _forwarded("defaults")

    def __getattr__(self, name: str) -> Any:  # only for what this object does not have itself
        if name == "_trainscale":
            raise AttributeError(name)
        return getattr(self._trainscale[0], name)

    def step(self, closure: Any = None) -> None:
        if closure is not None:
            raise TypeError("this strategy's optimizer step takes no closure")
        optimizer, strategy, model = self._trainscale
        strategy.optimizer_step(optimizer, model)

    def zero_grad(self, set_to_none: bool = True) -> None:
        optimizer, strategy, model = self._trainscale
        strategy.zero_grad(optimizer, model)

    def state_dict(self) -> dict[str, Any]:
        return self._trainscale[0].state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._trainscale[0].load_state_dict(state_dict)


def through_strategy(optimizer: Any, strategy: Any, model: Any) -> Any:
    """``optimizer`` with step()/zero_grad() done by ``strategy`` for ``model``."""
    cls = type(f"Trainscale{type(optimizer).__name__}", (_ThroughStrategy, type(optimizer)), {})
    handed = cls.__new__(cls)  # no __init__: nothing of the optimizer is copied, everything is delegated
    handed._trainscale = (optimizer, strategy, model)
    return handed


def inner(optimizer: Any) -> Any:
    """The strategy's own optimizer behind one :func:`through_strategy` handed out (else ``optimizer``)."""
    handed = getattr(optimizer, "_trainscale", None)
    return handed[0] if isinstance(handed, tuple) else optimizer
