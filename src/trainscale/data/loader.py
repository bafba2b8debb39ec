"""A DataLoader sharded over ranks that never forgets `sampler.set_epoch` (the commonest DDP bug)."""

from __future__ import annotations

import itertools
from typing import Any, Iterator

import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler

from trainscale.errors import ConfigError


def check_shardable(dataset_len: int, world_size: int, batch_size: int, what: str = "dataset") -> None:
    """Every rank must get at least one full batch, or training silently does nothing on some ranks."""
    if batch_size < 1:
        raise ConfigError(f"batch size {batch_size} must be >= 1", hint="give the per-rank batch size, e.g. --batch-size 16")
    need = world_size * batch_size
    if dataset_len < need:
        raise ConfigError(f"the {what} has {dataset_len} samples but {world_size} rank(s) x batch size {batch_size} "
                          f"need at least {need}", hint=f"use a batch size <= {max(1, dataset_len // world_size)}, "
                                                        "fewer ranks, or more data")


class _Resumable(Sampler):
    """A sampler whose next pass starts ``skip`` indices in (a run resumed mid-epoch), so that the
    batches already trained on are never loaded again; its length stays the whole epoch's."""

    def __init__(self, sampler: DistributedSampler) -> None:
        self.sampler, self.skip = sampler, 0

    def __iter__(self) -> Iterator[int]:
        skip, self.skip = self.skip, 0
        return itertools.islice(iter(self.sampler), skip, None)

    def __len__(self) -> int:
        return len(self.sampler)


class _EpochState:
    """Where the loader is, as checkpoint state: inside an epoch, that epoch and the batches of it handed out;
    between epochs, where the next ``for`` loop starts. A run interrupted mid-epoch resumes the rest of that
    epoch, every batch of it once (an ``iter()`` left unfinished still gives way to the next epoch: the
    training loop's ``for``, which drops the micro-batches an accumulation does not fill)."""

    epoch = start = 0
    """Where the next ``for`` loop starts."""
    _position: tuple[int, int] | None = None
    """(epoch, batches handed out) of the ``for`` loop in progress, None between epochs."""

    def state_dict(self) -> dict:
        epoch, batch = self._position if self._position is not None else (self.epoch, self.start)
        return {"epoch": epoch, "batch": batch}

    def load_state_dict(self, state: dict) -> None:
        """The next ``for`` loop runs epoch ``state["epoch"]`` from its batch ``state.get("batch", 0)``."""
        self.epoch, self.start = int(state["epoch"]), int(state.get("batch", 0))
        self._position = None

    def _epoch(self) -> tuple[int, int]:
        """A ``for`` loop begins: (its epoch, its first batch); the next one starts the epoch after."""
        epoch, start = self.epoch, self.start
        self.epoch, self.start, self._position = epoch + 1, 0, (epoch, start)
        return epoch, start

    def _handed_out(self, epoch: int, batches: int, last: bool) -> None:
        self._position = None if last else (epoch, batches)


class DistributedLoader(_EpochState):
    """Iterate one epoch per ``for`` loop; the sampler's epoch advances by itself. Its state goes into
    checkpoints, so a resumed run shuffles exactly as an uninterrupted one and starts mid-epoch without
    loading the batches it skips."""

    def __init__(self, dataset: Dataset, *, batch_size: int, rank: int = 0, world_size: int = 1,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = True, num_workers: int = 0,
                 pin_memory: bool = False, **loader_kwargs: Any) -> None:
        check_shardable(len(dataset), world_size, batch_size)
        self.sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle,
                                          seed=seed, drop_last=drop_last)
        self._resumable = _Resumable(self.sampler)
        self.loader = DataLoader(dataset, batch_size=batch_size, sampler=self._resumable, num_workers=num_workers,
                                 pin_memory=pin_memory, drop_last=drop_last,
                                 persistent_workers=num_workers > 0, **loader_kwargs)
        self.batch_size = batch_size

    @classmethod
    def for_runtime(cls, dataset: Dataset, runtime, **kwargs: Any) -> "DistributedLoader":
        kwargs.setdefault("pin_memory", runtime.device.type == "cuda")
        kwargs.setdefault("seed", runtime.seed)
        return cls(dataset, rank=runtime.rank, world_size=runtime.world_size, **kwargs)

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator:
        epoch, start = self._epoch()
        self.sampler.set_epoch(epoch)
        self._resumable.skip = start * self.batch_size
        total = len(self.loader)
        for done, batch in enumerate(self.loader, start + 1):
            self._handed_out(epoch, done, done == total)
            yield batch


class DeviceTensorLoader(_EpochState):
    """Small data kept whole on the device; batches are index slices, no per-sample Python work.

    Sharding follows DistributedSampler exactly (permute with seed + epoch, pad or drop to a multiple
    of world_size, take every world_size-th index from ``rank``), so results match the DataLoader path.
    """

    def __init__(self, *tensors: torch.Tensor, batch_size: int, rank: int = 0, world_size: int = 1,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = True,
                 device: torch.device | str = "cpu") -> None:
        if not tensors:
            raise ConfigError("DeviceTensorLoader needs at least one tensor", hint="pass (inputs, targets)")
        n = tensors[0].shape[0]
        if any(t.shape[0] != n for t in tensors):
            raise ConfigError("DeviceTensorLoader: tensors differ in their first dimension",
                              hint="inputs and targets must have one row per sample")
        check_shardable(n, world_size, batch_size)
        self.tensors = tuple(t.to(device, non_blocking=True) for t in tensors)
        self.n, self.batch_size, self.rank, self.world_size = n, batch_size, rank, world_size
        self.shuffle, self.seed, self.drop_last = shuffle, seed, drop_last

    @classmethod
    def for_runtime(cls, *tensors: torch.Tensor, runtime, **kwargs: Any) -> "DeviceTensorLoader":
        kwargs.setdefault("seed", runtime.seed)
        return cls(*tensors, rank=runtime.rank, world_size=runtime.world_size, device=runtime.device, **kwargs)

    def _shard_indices(self, epoch: int) -> torch.Tensor:
        seeded = torch.Generator().manual_seed(self.seed + epoch)
        order = torch.randperm(self.n, generator=seeded) if self.shuffle else torch.arange(self.n)
        if self.drop_last:
            total = (self.n // self.world_size) * self.world_size
            order = order[:total]
        else:
            total = -(-self.n // self.world_size) * self.world_size
            order = torch.cat([order, order[: total - self.n]])
        return order[self.rank:total:self.world_size]

    def __len__(self) -> int:
        per_rank = self.n // self.world_size if self.drop_last else -(-self.n // self.world_size)
        return per_rank // self.batch_size

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        epoch, start = self._epoch()
        indices = self._shard_indices(epoch).to(self.tensors[0].device)
        for i in range(start, len(self)):
            batch = indices[i * self.batch_size:(i + 1) * self.batch_size]
            self._handed_out(epoch, i + 1, i + 1 == len(self))
            yield tuple(t.index_select(0, batch) for t in self.tensors)
