"""Data-parallel training on 1, 2 and 4 gloo ranks equals single-process training, and equals raw DDP.

Tolerance: the all-reduce sums per-rank gradients in a different order than one process sums its
batch, so results agree to fp32 rounding, not bitwise. We assert max |Δ| / max |p| <= 1e-6 per tensor
after K plain-SGD steps (Adam's g/sqrt(v) would amplify sign flips of near-zero gradients).
"""

from __future__ import annotations

import pytest
import torch
from helpers.multiproc import run_on_ranks

GLOBAL_BATCH, STEPS, N_SAMPLES = 16, 4, 64
REL_TOL = 1e-6


def _data():
    from trainscale.data.images import synthetic_images

    split = synthetic_images(N_SAMPLES, seed=3)
    return split.images, split.labels


def _model():
    from trainscale.workloads.cnn import CNN

    torch.manual_seed(7)
    return CNN()


def train_with_trainscale() -> dict[str, torch.Tensor]:
    import trainscale
    from trainscale.data import DeviceTensorLoader
    from trainscale.strategies import get_strategy

    with trainscale.init(seed=0) as rt:
        images, labels = _data()
        loader = DeviceTensorLoader.for_runtime(
            images, labels, runtime=rt, batch_size=GLOBAL_BATCH // rt.world_size, shuffle=False
        )
        strategy = get_strategy("ddp")
        model, opt = strategy.wrap(_model(), lambda p: torch.optim.SGD(p, lr=0.05), rt)
        batches = iter(loader)
        for _ in range(STEPS):
            x, y = next(batches)
            loss = torch.nn.functional.nll_loss(model(x), y)
            strategy.backward_loss(loss, model)
            strategy.micro_step(opt, model, last=True)
        return {k: v.detach().clone() for k, v in strategy.unwrap(model).state_dict().items()}


def train_with_raw_ddp() -> dict[str, torch.Tensor]:
    """The hand-written seed-004 way: init_process_group, DistributedSampler, DDP."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

    dist.init_process_group("gloo")
    try:
        world = dist.get_world_size()
        images, labels = _data()
        dataset = TensorDataset(images, labels)
        sampler = DistributedSampler(dataset, shuffle=False, drop_last=True)
        loader = DataLoader(dataset, batch_size=GLOBAL_BATCH // world, sampler=sampler, drop_last=True)
        model = DDP(_model())
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        batches = iter(loader)
        for _ in range(STEPS):
            x, y = next(batches)
            loss = torch.nn.functional.nll_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return {k: v.detach().clone() for k, v in model.module.state_dict().items()}
    finally:
        dist.destroy_process_group()


def _max_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)) for k in b)


@pytest.fixture(scope="module")
def single():
    with pytest.MonkeyPatch.context() as mp:  # trainscale.init() sets OMP_NUM_THREADS for this process
        mp.setenv("OMP_NUM_THREADS", "")  # recorded, so the value init() sets is undone afterwards
        mp.delenv("OMP_NUM_THREADS")
        return train_with_trainscale()  # world size 1: no process group at all


@pytest.mark.parametrize("world_size", [2, 4])
def test_ranks_match_single_process(single, world_size):
    results = run_on_ranks(train_with_trainscale, world_size)
    for rank in range(1, world_size):  # replicas identical on every rank
        for key in results[0]:
            assert torch.equal(results[0][key], results[rank][key])
    assert _max_rel_diff(results[0], single) <= REL_TOL


def test_training_actually_moved_the_weights(single):
    assert _max_rel_diff(single, _model().state_dict()) > 1e-3


def test_trainscale_equals_raw_ddp_bitwise():
    ours = run_on_ranks(train_with_trainscale, 2)[0]
    raw = run_on_ranks(train_with_raw_ddp, 2)[0]
    for key in raw:
        assert torch.equal(ours[key], raw[key]), key
