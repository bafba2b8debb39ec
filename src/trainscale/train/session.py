"""The simple path: what ``trainscale.init()`` returns, a Runtime that also sets up a model for a strategy.

    with trainscale.init(seed=0) as rt:
        model = MyModel()
        model, opt = rt.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3), strategy="fsdp")
        for x, y in loader:
            loss = loss_fn(model(x.to(rt.device)), y.to(rt.device))
            rt.backward(loss)
            opt.step()
            opt.zero_grad()

As short as Lightning Fabric's, and what trainscale adds stays: detection of the launch, the device,
the process group, seeds, ``rt.guard`` against hangs, checkpoints that resume on any world size.
Gradient accumulation: ``with rt.no_sync(model, enabled=not last):`` around the accumulating
micro-batches (DeepSpeed accumulates by itself: give ``accumulation=`` to setup and step every micro-batch).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch import nn

from trainscale.checkpoint import ModelState
from trainscale.errors import ConfigError
from trainscale.runtime.runtime import Runtime, init as init_runtime
from trainscale.strategies import get_strategy
from trainscale.strategies.base import OptimizerSource, Strategy
from trainscale.strategies.handout import inner


@dataclass(kw_only=True)
class Session(Runtime):
    """A :class:`~trainscale.runtime.Runtime` with ``setup``/``backward``/``no_sync`` for the models it set up."""

    _setups: list[tuple[nn.Module, Strategy]] = field(default_factory=list)

    def setup(self, model: nn.Module, optimizer: OptimizerSource, *, strategy: str | Strategy = "ddp",
              micro_batch_size: int | None = None, accumulation: int | None = None) -> tuple[nn.Module, Any]:
        """``model`` moved to this rank's device and wrapped for ``strategy`` ("ddp", "zero1", "fsdp",
        "deepspeed", or "name:key=value,..."), and its optimizer: pass a ready one (built on
        ``model.parameters()``, parameter groups included) or a factory. ``micro_batch_size`` and
        ``accumulation``: DeepSpeed's config needs them (the per-rank batch, micro-batches per step)."""
        chosen = get_strategy(strategy)
        if micro_batch_size is not None:
            chosen = chosen.with_batch(micro_batch_size, accumulation)
        wrapped, opt = chosen.wrap(model, optimizer, self)
        self._setups.append((wrapped, chosen))
        return wrapped, chosen.user_optimizer(opt, wrapped)

    def backward(self, loss: torch.Tensor, model: nn.Module | None = None) -> None:
        """``loss.backward()`` the strategy's way (loss scaling, DeepSpeed's engine)."""
        wrapped, strategy = self._find(model)
        strategy.backward_loss(loss, wrapped)

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module | None = None, enabled: bool = True) -> Iterator[None]:
        """Skip the gradient synchronisation inside (accumulating micro-batches), when ``enabled``."""
        wrapped, strategy = self._find(model)
        with strategy.accumulate(wrapped, last=not enabled):
            yield

    def unwrap(self, model: nn.Module | None = None) -> nn.Module:
        """The module you passed to setup, inside any wrapper."""
        wrapped, strategy = self._find(model)
        return strategy.unwrap(wrapped)

    def checkpoint_state(self, model: nn.Module, optimizer: Any) -> ModelState:
        """The model's and optimizer's entry for a Checkpointer (saved and restored the strategy's way)."""
        wrapped, strategy = self._find(model)
        return strategy.checkpoint_state(wrapped, inner(optimizer))

    def strategy_of(self, model: nn.Module | None = None) -> Strategy:
        return self._find(model)[1]

    def _find(self, model: nn.Module | None) -> tuple[nn.Module, Strategy]:
        if not self._setups:
            raise ConfigError("no model was set up on this runtime",
                              hint="model, opt = rt.setup(model, optimizer, strategy='ddp') first")
        if model is None:
            if len(self._setups) > 1:
                raise ConfigError(f"{len(self._setups)} models were set up: which one?",
                                  hint="pass the model, e.g. rt.backward(loss, model)")
            return self._setups[0]
        for wrapped, strategy in self._setups:
            if model is wrapped:
                return wrapped, strategy
        raise ConfigError("this model was not set up on this runtime",
                          hint="pass the model rt.setup returned, not the one you gave it")


def init(**kwargs: Any) -> Session:
    """``trainscale.init``: :func:`trainscale.runtime.init` (same arguments), returning a :class:`Session`."""
    runtime = init_runtime(**kwargs)
    return Session(**{f.name: getattr(runtime, f.name) for f in dataclasses.fields(Runtime)})
