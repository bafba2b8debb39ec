"""FSDP with fp16 mixed precision scales the loss: on 2 gloo ranks, gradients too small for fp16's
range (they flush to zero unscaled) still train, like the fp32 DDP run, and the scaler is checkpointed.

Tolerance: the update (weights after - before) of the fp16 run is within 10% (max |Δ| relative to
the largest fp32 update) of the fp32 DDP run's, after K plain-SGD steps (fp16 keeps 11 bits)."""

from __future__ import annotations

import torch
from helpers.multiproc import run_on_ranks
from torch import nn

STEPS, GLOBAL_BATCH, WIDTH = 3, 16, 32
TINY = 1e-7  # scales the loss so that its gradients (~1e-9) lie below fp16's smallest number (~6e-8)


def mlp() -> nn.Module:
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 4))


def train(rt, spec: str) -> tuple[dict[str, torch.Tensor], dict]:
    from trainscale.strategies import get_strategy
    from trainscale.strategies.base import OptimizerSpec

    g = torch.Generator().manual_seed(1)
    x = torch.randn(STEPS, GLOBAL_BATCH, WIDTH, generator=g)
    y = torch.randint(0, 4, (STEPS, GLOBAL_BATCH), generator=g)
    per = GLOBAL_BATCH // rt.world_size
    strategy = get_strategy(spec)
    model, opt = strategy.wrap(mlp(), OptimizerSpec(torch.optim.SGD, {"lr": 1e5}), rt)
    for i in range(STEPS):
        xs, ys = x[i, rt.rank * per : (rt.rank + 1) * per], y[i, rt.rank * per : (rt.rank + 1) * per]
        strategy.backward_loss(nn.functional.cross_entropy(model(xs).float(), ys) * TINY, model)
        strategy.micro_step(opt, model, last=True)
    params = strategy.full_model_state(model)
    checkpointed = strategy.checkpoint_state(model, opt).state_dict()
    saved = {k: v for k, v in checkpointed.items() if k not in ("model", "optimizer")}
    return {k: v.detach().float().clone() for k, v in params.items()}, saved


def fp32_and_fp16() -> dict:
    import trainscale

    with trainscale.init(seed=0, set_threads=False) as rt:
        return {"ddp": train(rt, "ddp"), "fp16": train(rt, "fsdp:mixed_precision=fp16")}


def test_fsdp_fp16_scales_the_loss_so_small_gradients_still_train():
    result = run_on_ranks(fp32_and_fp16, 2)[0]
    start = mlp().state_dict()
    (ddp, _), (fp16, saved) = result["ddp"], result["fp16"]
    for key in ddp:
        moved = ddp[key] - start[key]
        assert moved.abs().max() > 0, key  # the fp32 run trains with these gradients
        error = float((fp16[key] - start[key] - moved).abs().max() / moved.abs().max())
        assert error <= 0.1, (key, error)  # unscaled fp16 gradients were 0: the weights never moved (error 1)
    assert saved["grad_scaler"]["scale"] > 1.0  # the scaler is checkpointed with the weights
