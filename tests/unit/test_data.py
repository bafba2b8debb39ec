"""Sharding: the device-resident loader shards exactly like DistributedSampler, and epochs advance."""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import TensorDataset

from trainscale.data import DeviceTensorLoader, DistributedLoader
from trainscale.errors import ConfigError


def _indices_from(loader) -> list[list[int]]:
    return [batch[0].tolist() for batch in loader]


@pytest.mark.parametrize("drop_last", [True, False])
@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("world", [1, 2, 3])
def test_both_loaders_shard_exactly_like_torchs_distributed_sampler(shuffle, world, drop_last):
    from torch.utils.data import DistributedSampler

    n, bs = 23, 2
    idx = torch.arange(n)
    for rank in range(world):
        ours = DeviceTensorLoader(
            idx, batch_size=bs, rank=rank, world_size=world, shuffle=shuffle, seed=5, drop_last=drop_last
        )
        theirs = DistributedLoader(
            TensorDataset(idx), batch_size=bs, rank=rank, world_size=world, shuffle=shuffle, seed=5, drop_last=drop_last
        )
        torchs = DistributedSampler(
            TensorDataset(idx), num_replicas=world, rank=rank, shuffle=shuffle, seed=5, drop_last=drop_last
        )
        for epoch in range(2):  # two epochs: the epoch advances by itself in ours
            torchs.set_epoch(epoch)
            order = list(torchs)
            whole = len(order) // bs * bs if drop_last else len(order)
            expected = [order[i : i + bs] for i in range(0, whole, bs)]
            assert _indices_from(ours) == expected == _indices_from(theirs)


def test_epochs_reshuffle_without_set_epoch():
    loader = DistributedLoader(TensorDataset(torch.arange(40)), batch_size=40, shuffle=True)
    first, second = _indices_from(loader), _indices_from(loader)
    assert first != second and sorted(first[0]) == sorted(second[0])


def test_loader_state_resumes_the_shuffle():
    a = DeviceTensorLoader(torch.arange(30), batch_size=5, shuffle=True, seed=1)
    list(a), list(a)
    b = DeviceTensorLoader(torch.arange(30), batch_size=5, shuffle=True, seed=1)
    b.load_state_dict(a.state_dict())
    assert _indices_from(a) == _indices_from(b)


class Counted(TensorDataset):
    """A dataset that counts the samples read from it."""

    def __init__(self, n: int) -> None:
        super().__init__(torch.arange(n))
        self.reads = 0

    def __getitem__(self, index):
        self.reads += 1
        return super().__getitem__(index)


@pytest.mark.parametrize("kind", ["tensor", "dataloader"])
def test_a_loader_put_mid_epoch_starts_there_without_reading_what_it_skips(kind):
    def make():
        if kind == "tensor":
            return DeviceTensorLoader(torch.arange(40), batch_size=4, rank=1, world_size=2, shuffle=True, seed=3)
        return DistributedLoader(Counted(40), batch_size=4, rank=1, world_size=2, shuffle=True, seed=3)

    whole = make()
    list(whole)
    second_epoch = _indices_from(whole)
    resumed = make()
    resumed.load_state_dict({"epoch": 1, "consumed": 2 * 4 * 2})  # 2 batches of 4 on each of 2 ranks
    assert resumed.state_dict() == {"epoch": 1, "consumed": 16, "samples": 40}
    assert _indices_from(resumed) == second_epoch[2:]
    if kind == "dataloader":
        assert resumed.loader.dataset.reads == 4 * len(second_epoch[2:])  # the skipped batches were never read
    assert _indices_from(resumed) == _indices_from(whole)  # the next epoch is whole again
    assert len(resumed) == len(whole) == 5


def test_ranks_partition_the_data():
    idx = torch.arange(24)
    seen = sorted(
        i
        for r in range(4)
        for b in DeviceTensorLoader(idx, batch_size=3, rank=r, world_size=4, shuffle=True)
        for i in b[0].tolist()
    )
    assert seen == list(range(24))


@pytest.mark.parametrize("batch, world", [(0, 1), (8, 4)])
def test_too_little_data_or_zero_batch_is_a_clear_error(batch, world):
    with pytest.raises(ConfigError, match="batch size|need at least"):
        DeviceTensorLoader(torch.arange(20), batch_size=batch, world_size=world)
