"""The optimizer a script gets back from ``rt.setup`` when a strategy must see its step: fp16 loss
scaling (the scaler steps and updates) and DeepSpeed (its engine steps). It *is* an optimizer of the
same class (an LR scheduler accepts it; ``param_groups`` and ``state`` are the optimizer's own), and
only ``step``, ``zero_grad``, ``state_dict`` and ``load_state_dict`` are routed, as Lightning Fabric's
wrapped optimizer does. Strategies whose step is the optimizer's own hand out the optimizer itself.
"""

from __future__ import annotations

from typing import Any


class _ThroughStrategy:
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
    handed = cls.__new__(cls)
    # The same attribute objects (param_groups, state, hooks): LR changes and state are shared.
    handed.__dict__.update({k: v for k, v in optimizer.__dict__.items() if k not in ("step", "zero_grad")})
    handed._trainscale = (optimizer, strategy, model)
    return handed


def inner(optimizer: Any) -> Any:
    """The strategy's own optimizer behind one :func:`through_strategy` handed out (else ``optimizer``)."""
    handed = getattr(optimizer, "_trainscale", None)
    return handed[0] if isinstance(handed, tuple) else optimizer
