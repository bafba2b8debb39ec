"""rt.setup on 2 gloo ranks with a ready optimizer holding two parameter groups (other learning rates,
one group frozen out of a third layer): DDP equals one process on the whole batch (<= 1e-6, the
all-reduce's summation order), ZeRO-1 equals DDP bitwise, FSDP (its optimizer rebuilt on the sharded
parameters, found by name) within 1e-6; and FSDP's fp16 loss scaling works through ``opt.step()``."""

from __future__ import annotations

import torch
from helpers.multiproc import run_on_ranks
from torch import nn

STEPS, GLOBAL_BATCH, WIDTH = 3, 16, 16


def model() -> nn.Module:
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 4))


def optimizer(net: nn.Module) -> torch.optim.Optimizer:
    # layer 2 is in no group: it must stay as it was under every strategy
    return torch.optim.Adam(
        [{"params": net[0].parameters(), "lr": 1e-2}, {"params": net[4].parameters(), "lr": 1e-3, "weight_decay": 0.1}],
        lr=5e-3,
    )


def batches(rank: int, world: int):
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(STEPS, GLOBAL_BATCH, WIDTH, generator=g), torch.randint(0, 4, (STEPS, GLOBAL_BATCH), generator=g)
    per = GLOBAL_BATCH // world
    return [(x[i, rank * per : (rank + 1) * per], y[i, rank * per : (rank + 1) * per]) for i in range(STEPS)]


def train(rt, strategy: str, scale: float = 1.0) -> dict[str, torch.Tensor]:
    net = model()
    net, opt = rt.setup(net, optimizer(net), strategy=strategy)
    for x, y in batches(rt.rank, rt.world_size):
        rt.backward(nn.functional.cross_entropy(net(x).float(), y) * scale, net)
        opt.step()
        opt.zero_grad()
    params = {k: v.detach().float().cpu().clone() for k, v in rt.strategy_of(net).full_model_state(net).items()}
    scaler = getattr(rt.strategy_of(net), "scaler", None)
    if scaler is not None:  # every opt.step() went through the loss scaler: step, then update
        params["scaler steps"] = torch.tensor(scaler.state_dict()["_growth_tracker"])
    return params


def on_ranks() -> dict:
    import trainscale

    with trainscale.init(seed=0, set_threads=False) as rt:
        out = {name: train(rt, name) for name in ("ddp", "zero1", "fsdp")}
        out["fp16"] = train(rt, "fsdp:mixed_precision=fp16", scale=1e-7)  # gradients below fp16's range unscaled
    return out


def test_a_ready_optimizer_with_groups_under_ddp_zero1_and_fsdp():
    import trainscale

    with trainscale.init(environ={}, set_threads=False) as rt:  # one process, the whole batch
        single = train(rt, "ddp")
    result = run_on_ranks(on_ranks, 2)[0]
    start = model().state_dict()
    ddp = result["ddp"]
    assert int(result["fp16"].pop("scaler steps")) == STEPS
    for key in ddp:
        assert float((ddp[key] - single[key]).abs().max() / single[key].abs().max()) <= 1e-6, key
        assert torch.equal(ddp[key], result["zero1"][key]), key
        assert float((ddp[key] - result["fsdp"][key]).abs().max() / ddp[key].abs().max()) <= 1e-6, key
    for name in ("ddp", "zero1", "fsdp", "fp16"):
        assert torch.equal(result[name]["2.weight"], start["2.weight"]), f"{name} trained the frozen layer"
        # the group without weight decay moves only with real gradients (unscaled fp16 ones are all zero)
        assert not torch.equal(result[name]["0.weight"], start["0.weight"]), f"{name} did not train"
