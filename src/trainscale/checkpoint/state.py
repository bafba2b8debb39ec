"""The typed interface between what is saved and how: torch.distributed.checkpoint's ``Stateful``
(``state_dict()`` / ``load_state_dict()``), as torchtitan uses it, plus one class for the model and
optimizer of a strategy, which also says how that state is kept: one :class:`Storage` of three.

A save is a mapping of names to entries (see :class:`~trainscale.checkpoint.Checkpointer`):

- one :class:`ModelState` (``strategy.checkpoint_state(model, optimizer)``): its ``state_dict()``
  entries ("model", "optimizer", and what else the strategy keeps, e.g. "grad_scaler") go into the
  checkpoint, stored the strategy's way (its :class:`Storage`);
- any other ``Stateful`` (an LR scheduler, a loader, :class:`RNGState`): its ``state_dict()`` under its name;
- plain values (ints, tensors, dicts of them): as they are.

Restoring fills the ModelState and the Stateful entries in place and hands back the plain values.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from trainscale.checkpoint import files, layout, sharded
from trainscale.errors import CheckpointError, ConfigError
from trainscale.runtime.seed import rng_state, set_rng_state


@runtime_checkable
class Stateful(Protocol):
    """torch.distributed.checkpoint.stateful.Stateful: anything with state_dict/load_state_dict
    (modules, optimizers, LR schedulers, trainscale's loaders)."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...


class Storage(ABC):
    """One way of keeping a ModelState's model and optimizer state (:data:`FILE`, :data:`DCP`,
    :data:`NATIVE`): the Checkpointer saves and restores through it and never asks which it is.
    ``entries`` are everything saved (the model state's and the others'), ``record`` what the
    checkpoint says about itself."""

    name: ClassVar[str]
    writes_on_every_rank: ClassVar[bool] = True
    """Every rank writes into the checkpoint directory (so every rank must be able to)."""
    can_background: ClassVar[bool] = True
    """trainscale writes this state itself, so it can stage it and write it in the background."""

    @abstractmethod
    def save(
        self,
        directory: Path,
        step: int,
        entries: dict[str, Any],
        record: dict[str, Any],
        runtime: Any,
        model: ModelState | None,
    ) -> Path:
        """Every rank: write checkpoint ``step``; its final path."""

    def save_async(
        self,
        directory: Path,
        step: int,
        entries: dict[str, Any],
        record: dict[str, Any],
        runtime: Any,
        *,
        stager: Any,
        group: Callable[[], Any],
        before_rename: Callable[[], None],
    ) -> tuple[Path, Callable[[], None] | None]:
        """Every rank: stage ``entries`` now (``group()``: the background's own process group); (the final
        path, this rank's job that writes them in the background, or None)."""
        raise NotImplementedError(f"{self.name} storage cannot save in the background")

    @abstractmethod
    def restore(self, model: ModelState, found: Any) -> None:
        """Every rank: load ``found``'s (a manager.Found) model/optimizer state into ``model``."""

    def resolve_async(self, asked: bool | None, strategy: str) -> bool:
        """Whether saves run in the background: as ``asked`` (``--checkpoint-async`` / ``--no-checkpoint-async``),
        or wherever they can when None; asked where they cannot: ConfigError."""
        if self.can_background:
            return asked is not False
        if asked:
            raise ConfigError(
                f"--checkpoint-async: the {strategy} strategy's engine writes its own checkpoint files ({self.name} "
                "storage), which trainscale cannot stage and save in the background",
                hint="use --no-checkpoint-async (or leave the option out: saves are then synchronous for this "
                "strategy), or a strategy whose checkpoints trainscale writes (ddp, zero1, fsdp)",
            )
        return False


class _File(Storage):
    """Rank 0 writes one file with the state_dict() it gathered (ddp, zero1)."""

    name, writes_on_every_rank = "file", False

    def save(self, directory, step, entries, record, runtime, model):
        runtime.barrier()  # everybody has finished the step that is being saved
        if runtime.is_main:
            files.save_file(directory, step, entries, record)
        return layout.file_path(directory, step)

    def save_async(self, directory, step, entries, record, runtime, *, stager, group, before_rename):
        if not runtime.is_main:
            return layout.file_path(directory, step), None  # rank 0 alone writes the file
        staged = stager.stage(entries)
        return layout.file_path(directory, step), lambda: files.save_file(
            directory, step, staged, record, before_rename=before_rename
        )

    def restore(self, model, found):
        if found.shards is None:
            model.load_state_dict(found.contents)
        else:  # another strategy's shards (fsdp's DCP, DeepSpeed's own files), read whole into this layout
            model.load_state_dict({**found.contents, **model.from_shards(found.shards)})


class _DCP(Storage):
    """Every rank writes its shards of "model" and "optimizer" with torch.distributed.checkpoint, and any
    world size reads them back into its own layout (fsdp); a rank-0 file loads too."""

    name = "dcp"

    def save(self, directory, step, entries, record, runtime, model):
        return sharded.save(directory, step, entries, runtime, record)

    def save_async(self, directory, step, entries, record, runtime, *, stager, group, before_rename):
        return sharded.save_async(
            directory, step, entries, runtime, record, stager=stager, group=group(), before_rename=before_rename
        )

    def restore(self, model, found):
        if found.shards is None:  # a rank-0 file holds everything (read by every rank)
            model.load_state_dict(found.contents)
        elif found.shards.format != "dcp":  # a strategy's own files (DeepSpeed's), read whole as a rank-0 file
            model.load_state_dict({**found.contents, **model.from_shards(found.shards)})
        else:
            model.load_state_dict({**found.contents, **found.shards.load(model.state_dict())})


class _Native(Storage):
    """The strategy writes and reads its own files in a sharded checkpoint's directory (:meth:`ModelState.write`,
    :meth:`ModelState.read`; deepspeed); its engine writes them, so they cannot be staged."""

    name, can_background = "native", False

    def save(self, directory, step, entries, record, runtime, model):
        return sharded.save(directory, step, entries, runtime, record, write_native=model.write)

    def restore(self, model, found):
        if found.shards is None or found.shards.format == "dcp":
            raise CheckpointError(
                f"{found.path} was not written by the {found.record.get('strategy')} strategy's own format",
                hint="resume with the strategy that wrote it, or start a new checkpoint directory",
            )
        model.read(found.path, found.record)


FILE, DCP, NATIVE = _File(), _DCP(), _Native()


class ModelState(ABC):
    """A strategy's model and optimizer state, bound to them; ``storage`` (a :class:`Storage`) says how
    it is kept: :data:`FILE` (the default), :data:`DCP` or :data:`NATIVE`."""

    storage: ClassVar[Storage] = FILE

    @abstractmethod
    def state_dict(self) -> dict[str, Any]:
        """This run's entries ("model", "optimizer", ...); for ``DCP`` also the layout shards load into;
        for ``NATIVE`` none (its state is in its own files)."""

    @abstractmethod
    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...

    def from_shards(self, shards: Any) -> dict[str, Any]:
        """``FILE`` storage: another strategy's DCP shards (``shards``, a sharded.ShardedRef) as the entries
        this state's rank-0 file would hold (every rank calls it: a collective)."""
        raise CheckpointError(
            f"{type(self).__name__} cannot read another strategy's shards",
            hint="resume with the strategy that wrote the checkpoint",
        )

    def write(self, directory: Path) -> None:
        """``NATIVE`` storage: write this rank's files into ``directory`` (every rank calls it)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no native files")

    def read(self, directory: Path, record: dict[str, Any]) -> None:
        """``NATIVE`` storage: restore from ``directory``; ``record`` is what the checkpoint says about itself."""
        raise NotImplementedError(f"{type(self).__name__} keeps no native files")


class RNGState:
    """Every RNG a training step draws from (Python, NumPy, torch's CPU generator and this rank's GPU),
    as a Stateful. Saved by rank 0 and restored on every rank: ranks are seeded alike and draw alike."""

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device

    def state_dict(self) -> dict[str, Any]:
        return rng_state(self.device)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        set_rng_state(state_dict, self.device)
