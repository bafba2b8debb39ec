"""Data-parallel training over NCCL on 1, 2 and all GPUs equals one process on the whole batch.

Tolerance (docs/gpu.md): fp32 with TF32 off, max |Δ| / max |p| per tensor after K plain-SGD steps
<= 1e-5 (the all-reduce sums the ranks' gradients in another order than one process sums its batch).
ZeRO-1 equals DDP bitwise; FSDP and DeepSpeed are in tests/gpu/test_gpu_strategies.py.
"""

from __future__ import annotations

import pytest
import torch
from helpers.multiproc import run_on_ranks

TOL = 1e-5


def ddp_params(device: str) -> dict[str, torch.Tensor]:
    import trainscale
    from trainscale.selftest.checks import STEPS, batch, exact_fp32, mlp, params
    from trainscale.strategies import get_strategy

    with trainscale.init(device=device, timeout_s=120) as rt, exact_fp32():
        strategy = get_strategy("ddp")
        model, opt = strategy.wrap(mlp(), lambda p: torch.optim.SGD(p, lr=0.05), rt)
        for i in range(STEPS):
            x, y = batch(i, rt)
            strategy.backward_loss(torch.nn.functional.cross_entropy(model(x), y), model)
            strategy.micro_step(opt, model, last=True)
        return params(model)


def one_process(device: str) -> dict[str, torch.Tensor]:
    """The whole global batch on one device, no process group at all."""
    from types import SimpleNamespace

    from trainscale.selftest.checks import STEPS, batch, exact_fp32, mlp, params

    dev = torch.device(device if device == "cpu" else "cuda", 0) if device != "cpu" else torch.device("cpu")
    rt = SimpleNamespace(device=dev, rank=0, world_size=1)
    with exact_fp32():
        model = mlp().to(dev)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for i in range(STEPS):
            x, y = batch(i, rt, whole=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
        return params(model)


def _max_rel(a, b) -> float:
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)) for k in b)


@pytest.fixture(scope="module")
def reference(gpus):
    return run_on_ranks(one_process, 1, gpus.device, timeout=300)[0]


@pytest.mark.parametrize("world", [1, 2, "all"])
def test_n_gpus_equal_one_process(gpus, reference, world):
    n = gpus.count if world == "all" else world
    if world == "all" and gpus.count <= 2:
        pytest.skip("'all' GPUs is the 1- or 2-GPU case on this machine")
    gpus.need(n)
    results = run_on_ranks(ddp_params, n, gpus.device, timeout=300)
    for rank in range(1, n):  # every replica identical
        assert all(torch.equal(results[0][k], results[rank][k]) for k in results[0]), rank
    diff = _max_rel(results[0], reference)
    print(f"{n} rank(s) vs one process: max rel. diff {diff:.2e}")
    assert diff <= TOL
    assert _max_rel(results[0], one_process_start()) > 1e-3  # training moved the weights


def one_process_start() -> dict[str, torch.Tensor]:
    from trainscale.selftest.checks import mlp, params

    return params(mlp())
