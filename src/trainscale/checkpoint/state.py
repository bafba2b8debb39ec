"""The typed interface between what is saved and how: torch.distributed.checkpoint's ``Stateful``
(``state_dict()`` / ``load_state_dict()``), as torchtitan uses it, plus one class for the model and
optimizer of a strategy, which also says how that state is stored.

A save is a mapping of names to entries (see :class:`~trainscale.checkpoint.Checkpointer`):

- one :class:`ModelState` (``strategy.checkpoint_state(model, optimizer)``): its ``state_dict()``
  entries ("model", "optimizer", and what else the strategy keeps, e.g. "grad_scaler") go into the
  checkpoint, stored the strategy's way (:attr:`ModelState.storage`);
- any other ``Stateful`` (an LR scheduler, a loader, :class:`RNGState`): its ``state_dict()`` under its name;
- plain values (ints, tensors, dicts of them): as they are.

Restoring fills the ModelState and the Stateful entries in place and hands back the plain values.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

FILE, DCP, NATIVE = "file", "dcp", "native"
STORAGES = (FILE, DCP, NATIVE)


@runtime_checkable
class Stateful(Protocol):
    """torch.distributed.checkpoint.stateful.Stateful: anything with state_dict/load_state_dict
    (modules, optimizers, LR schedulers, trainscale's loaders)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class ModelState(ABC):
    """A strategy's model and optimizer state, bound to them. ``storage`` says how it is kept:

    - ``file``: rank 0 writes one file with the state_dict() it gathered (ddp, zero1);
    - ``dcp``: every rank writes its shards of "model" and "optimizer" with torch.distributed.checkpoint,
      and any world size reads them back into its own layout (fsdp);
    - ``native``: the strategy writes and reads its own files in the checkpoint's directory
      (:meth:`write`, :meth:`read`; deepspeed).
    """

    storage: ClassVar[str] = FILE

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """This run's entries ("model", "optimizer", ...); for ``dcp`` also the layout shards load into."""

    @abstractmethod
    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...

    def write(self, directory: Path) -> None:
        """``native`` storage: write this rank's files into ``directory`` (every rank calls it)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no native files")

    def read(self, directory: Path, record: dict[str, Any]) -> None:
        """``native`` storage: restore from ``directory``; ``record`` is what the checkpoint says about itself."""
        raise NotImplementedError(f"{type(self).__name__} keeps no native files")


class RNGState:
    """Every RNG a training step draws from (Python, NumPy, torch's CPU generator and this rank's GPU),
    as a Stateful. Saved by rank 0 and restored on every rank: ranks are seeded alike and draw alike."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device

    def state_dict(self) -> dict[str, Any]:
        from trainscale.runtime.seed import rng_state

        return rng_state(self.device)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        from trainscale.runtime.seed import set_rng_state

        set_rng_state(state_dict, self.device)
