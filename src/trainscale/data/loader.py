"""Loaders sharded over ranks that never forget `sampler.set_epoch` (the commonest DDP bug), with a global
data cursor: where an epoch stands is how many samples of its global order are consumed, not any rank's
position, so a run saved on S ranks resumes mid-epoch on R ranks and trains every remaining sample once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from trainscale.errors import ConfigError


def check_shardable(dataset_len: int, world_size: int, batch_size: int, what: str = "dataset") -> None:
    """Every rank must get at least one full batch, or training silently does nothing on some ranks."""
    if batch_size < 1:
        raise ConfigError(
            f"batch size {batch_size} must be >= 1", hint="give the per-rank batch size, e.g. --batch-size 16"
        )
    need = world_size * batch_size
    if dataset_len < need:
        raise ConfigError(
            f"the {what} has {dataset_len} samples but {world_size} rank(s) x batch size {batch_size} "
            f"need at least {need}",
            hint=f"use a batch size <= {max(1, dataset_len // world_size)}, fewer ranks, or more data",
        )


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool) -> torch.Tensor:
    """The epoch's global order of sample indices, as torch's DistributedSampler draws it (every rank alike)."""
    if not shuffle:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))


def shard(order: torch.Tensor, consumed: int, rank: int, world_size: int, drop_last: bool) -> torch.Tensor:
    """This rank's indices of what is left of ``order`` after its first ``consumed``: every ``world_size``-th
    from ``rank``, the rest cut (``drop_last``) or padded by repeating (as DistributedSampler does) to a
    multiple of ``world_size``. With ``consumed`` 0 this is DistributedSampler's shard; after a rank's first
    ``b`` samples, the ranks together have consumed exactly the first ``b * world_size`` of what was left."""
    rest = order[consumed:]
    n = len(rest)
    if drop_last or n == 0:
        total = n // world_size * world_size
        rest = rest[:total]
    else:
        total = -(-n // world_size) * world_size
        rest = rest.repeat(-(-total // n))[:total]
    return rest[rank:total:world_size]


class _EpochState:
    """Where the loader is, as checkpoint state: the epoch and how many samples of its global order the ranks
    have consumed (a global cursor: the same on every rank, whatever their number). Inside an epoch, the pass in
    progress; between epochs, where the next ``for`` loop starts. A state saved on one number of ranks is
    resumed on any other: the rest of the epoch is split over this run's ranks, every sample of it once.
    An ``iter()`` left unfinished still gives way to the next epoch (the training loop's ``for``, which drops
    the micro-batches an accumulation does not fill) once :meth:`end_epoch` says so or a new ``for`` begins."""

    rank = 0
    world_size = 1
    batch_size = 1
    drop_last = True
    epoch = consumed = 0
    """Where the next ``for`` loop starts: its epoch and the samples of that epoch already consumed."""
    _position: tuple[int, int, int] | None = None
    """(epoch, consumed when it began, batches handed out) of the ``for`` loop in progress, None between epochs."""

    def _size(self) -> int:
        raise NotImplementedError

    def state_dict(self) -> dict:
        if self._position is None:
            return {"epoch": self.epoch, "consumed": self.consumed, "samples": self._size()}
        epoch, start, batches = self._position
        done = min(self._size(), start + batches * self.batch_size * self.world_size)
        return {"epoch": epoch, "consumed": done, "samples": self._size()}

    def load_state_dict(self, state: dict) -> None:
        """The next ``for`` loop runs epoch ``state["epoch"]`` from its ``state["consumed"]``-th sample; a state
        for a dataset of another size is refused (its cursor would point into other samples)."""
        if "consumed" not in state and state.get("batch"):  # a per-rank position: on which ranks is not known
            raise ConfigError(
                "the loader state gives a batch position of some ranks (written before trainscale kept "
                "a global cursor), not how much of the epoch was consumed",
                hint="resume with the trainscale that wrote it, or start anew (--fresh, or another "
                "checkpoint directory)",
            )
        samples = state.get("samples")
        if samples is not None and int(samples) != self._size():
            raise ConfigError(
                f"the loader state was saved for a dataset of {samples} samples; this one has {self._size()}",
                hint="resume with the data the checkpoint was written with, or "
                "start anew (--fresh, or another checkpoint directory)",
            )
        self.epoch, self.consumed = int(state["epoch"]), int(state.get("consumed", 0))
        self._position = None

    def end_epoch(self) -> None:
        """The training loop is done with the pass in progress (what it left unread stays unread): the next
        ``for`` loop, and the state saved before it, start the next epoch."""
        self._position = None

    def remaining(self) -> int:
        """Samples of the pending epoch not yet consumed (the whole epoch between epochs)."""
        return self._size() - self.consumed

    def _indices(self) -> tuple[int, torch.Tensor]:
        """A ``for`` loop begins: (its epoch, this rank's indices of it); the next one starts the epoch after."""
        epoch, start = self.epoch, self.consumed
        self.epoch, self.consumed, self._position = epoch + 1, 0, (epoch, start, 0)
        order = epoch_order(self._size(), self.seed, epoch, self.shuffle)
        return epoch, shard(order, start, self.rank, self.world_size, self.drop_last)

    def _handed_out(self, batches: int, last: bool) -> None:
        self._position = None if last else self._position[:2] + (batches,)

    def _pending(self) -> int:
        """This rank's samples in the pass the next ``for`` loop runs."""
        left = self.remaining()
        return left // self.world_size if self.drop_last or left == 0 else -(-left // self.world_size)

    def __len__(self) -> int:
        """Batches the next ``for`` loop yields on this rank (a whole epoch's, but for a run resumed mid-epoch)."""
        pending = self._pending()
        return pending // self.batch_size if self.drop_last else -(-pending // self.batch_size)


class _Indices(Sampler):
    """The sampler of a DistributedLoader: the indices of the pass that is starting, set by the loader."""

    def __init__(self) -> None:
        self.indices: list[int] = []

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices)

    def __len__(self) -> int:
        return len(self.indices)


class DistributedLoader(_EpochState):
    """Iterate one epoch per ``for`` loop; the epoch advances by itself. Its state goes into checkpoints, so a
    resumed run shuffles exactly as an uninterrupted one and starts mid-epoch without loading the samples
    already trained on, on this or any other number of ranks. Sharding is torch's DistributedSampler's."""

    def __init__(
        self,
        dataset: Dataset,
        *,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        num_workers: int = 0,
        pin_memory: bool = False,
        **loader_kwargs: Any,
    ) -> None:
        check_shardable(len(dataset), world_size, batch_size)
        self.dataset, self.rank, self.world_size, self.batch_size = dataset, rank, world_size, batch_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last
        self.sampler = _Indices()
        self.loader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=self.sampler,
            num_workers=num_workers,
            pin_memory=pin_memory,
            drop_last=drop_last,
            persistent_workers=num_workers > 0,
            **loader_kwargs,
        )

    @classmethod
    def for_runtime(cls, dataset: Dataset, runtime, **kwargs: Any) -> DistributedLoader:
        kwargs.setdefault("pin_memory", runtime.device.type == "cuda")
        kwargs.setdefault("seed", runtime.seed)
        return cls(dataset, rank=runtime.rank, world_size=runtime.world_size, **kwargs)

    def _size(self) -> int:
        return len(self.dataset)

    def __iter__(self) -> Iterator:
        _, indices = self._indices()
        self.sampler.indices = indices.tolist()
        total = len(self.loader)
        if total == 0:  # less than a batch left of the epoch on this rank: that pass is over
            self._handed_out(0, True)
        for done, batch in enumerate(self.loader, 1):
            self._handed_out(done, done == total)
            yield batch


class DeviceTensorLoader(_EpochState):
    """Small data kept whole on the device; batches are index slices, no per-sample Python work. Sharding is
    DistributedSampler's (permute with seed + epoch, pad or drop to a multiple of world_size, take every
    world_size-th index from ``rank``), so results match the DataLoader path."""

    def __init__(
        self,
        *tensors: torch.Tensor,
        batch_size: int,
        rank: int = 0,
        world_size: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        device: torch.device | str = "cpu",
    ) -> None:
        if not tensors:
            raise ConfigError("DeviceTensorLoader needs at least one tensor", hint="pass (inputs, targets)")
        n = tensors[0].shape[0]
        if any(t.shape[0] != n for t in tensors):
            raise ConfigError(
                "DeviceTensorLoader: tensors differ in their first dimension",
                hint="inputs and targets must have one row per sample",
            )
        check_shardable(n, world_size, batch_size)
        self.tensors = tuple(t.to(device, non_blocking=True) for t in tensors)
        self.n, self.batch_size, self.rank, self.world_size = n, batch_size, rank, world_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last

    @classmethod
    def for_runtime(cls, *tensors: torch.Tensor, runtime, **kwargs: Any) -> DeviceTensorLoader:
        kwargs.setdefault("seed", runtime.seed)
        return cls(*tensors, rank=runtime.rank, world_size=runtime.world_size, device=runtime.device, **kwargs)

    def _size(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        batches = len(self)
        _, indices = self._indices()
        indices = indices.to(self.tensors[0].device)
        if batches == 0:  # less than a batch left of the epoch on this rank: that pass is over
            self._handed_out(0, True)
        for i in range(batches):
            batch = indices[i * self.batch_size : (i + 1) * self.batch_size]
            self._handed_out(i + 1, i + 1 == batches)
            yield tuple(t.index_select(0, batch) for t in self.tensors)
