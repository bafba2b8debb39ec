"""FSDP's mixed precision holds on one process as on N (issue 22 item 2): a study's 1-rank baseline must
compute in the dtype its multi-rank runs do, or its speedups and MFU compare bf16 with fp32."""

from __future__ import annotations

import torch
from helpers.multiproc import run_on_ranks
from torch import nn


def compute_dtypes(mixed_precision: str) -> dict:
    import trainscale
    from trainscale.strategies import get_strategy
    from trainscale.strategies.base import OptimizerSpec

    seen: list[torch.dtype] = []
    with trainscale.init(seed=0, set_threads=False) as rt:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
        net[0].register_forward_hook(lambda module, args, out: seen.append(out.dtype))
        strategy = get_strategy(f"fsdp:mixed_precision={mixed_precision}")
        model, opt = strategy.wrap(net, OptimizerSpec(torch.optim.SGD, {"lr": 0.1}), rt)
        x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
        strategy.backward_loss(nn.functional.cross_entropy(model(x).float(), y), model)
        strategy.micro_step(opt, model, last=True)
        master = {p.dtype for p in model.parameters()}
    return {"compute": seen, "master": master}


def test_one_process_and_two_ranks_compute_in_the_same_dtype():
    alone = compute_dtypes("bf16")
    ranks = run_on_ranks(compute_dtypes, 2, "bf16")
    assert alone["compute"] == ranks[0]["compute"] == ranks[1]["compute"] == [torch.bfloat16]
    assert alone["master"] == ranks[0]["master"] == {torch.float32}  # the optimizer's copy stays fp32
    assert compute_dtypes("none")["compute"] == [torch.float32]
