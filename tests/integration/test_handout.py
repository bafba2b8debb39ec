"""The optimizer rt.setup hands out where the strategy must see the step (here fp16 FSDP on 2 gloo
ranks, whose loss scaler steps): an LR scheduler attached to it changes the learning rate that
trains, also after a resume replaced the inner optimizer's parameter groups (strategies/handout.py).
Before, the handed optimizer held a copy of the inner one's attributes: after the resume the
scheduler halved the copy's lr while the optimizer kept training at the saved one."""

from __future__ import annotations

import pytest
import torch
from helpers.multiproc import run_on_ranks
from torch import nn

LR = 0.1


def _setup(rt, seed: int):
    torch.manual_seed(seed)
    net = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))
    model, opt = rt.setup(net, torch.optim.SGD(net.parameters(), lr=LR), strategy="fsdp:mixed_precision=fp16")
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    return model, opt, scheduler


def _step(rt, model, opt, scheduler) -> dict[str, torch.Tensor]:
    """One optimizer step and one scheduler step; the update each parameter got, over its gradient."""
    before = {k: v.detach().full_tensor().float().clone() for k, v in model.named_parameters()}
    rt.backward(model(torch.ones(4, 8)).float().pow(2).sum(), model)
    opt.step()  # the scaler unscales the gradients in place, then the optimizer steps
    grads = {k: v.grad.full_tensor().float().clone() for k, v in model.named_parameters()}
    opt.zero_grad()
    scheduler.step()
    after = {k: v.detach().full_tensor().float() for k, v in model.named_parameters()}
    return {k: (before[k] - after[k])[grads[k] != 0] / grads[k][grads[k] != 0] for k in before}


def resume_with_a_scheduler(root: str) -> dict:
    import trainscale
    from trainscale.checkpoint import Checkpointer
    from trainscale.strategies.handout import inner

    out = {}
    with trainscale.init(seed=0, set_threads=False) as rt:
        model, opt, scheduler = _setup(rt, seed=0)
        out["handed"] = isinstance(opt, torch.optim.SGD) and inner(opt) is not opt  # a wrapper, a real SGD
        _step(rt, model, opt, scheduler)  # trained at LR; the scheduler halves it
        ck = Checkpointer(root, rt, strategy=rt.strategy_of(model))
        ck.save(1, {"model": rt.checkpoint_state(model, opt), "scheduler": scheduler})

        model, opt, scheduler = _setup(rt, seed=1)
        ck.restore({"model": rt.checkpoint_state(model, opt), "scheduler": scheduler})  # new inner param_groups
        out["shared"] = opt.param_groups is inner(opt).param_groups
        out["lr"] = [inner(opt).param_groups[0]["lr"]]
        for _ in range(2):
            out.setdefault("ratios", []).append(_step(rt, model, opt, scheduler))
            out["lr"].append(inner(opt).param_groups[0]["lr"])
    return out


@pytest.mark.slow
def test_a_scheduler_on_the_handed_optimizer_moves_the_learning_rate_that_trains_after_a_resume(tmp_path):
    for rank, out in run_on_ranks(resume_with_a_scheduler, 2, str(tmp_path)).items():
        assert out["handed"], rank
        assert out["lr"] == [LR / 2, LR / 4, LR / 8], out["lr"]  # the optimizer's own, stepped by the scheduler
        for ratios, lr in zip(out["ratios"], (LR / 2, LR / 4)):  # the update each weight got, over its gradient
            assert all(torch.allclose(r, torch.full_like(r, lr), rtol=1e-2) for r in ratios.values() if r.numel()), (
                lr,
                ratios,
            )
        assert out["shared"]  # param_groups are the optimizer's own, not a copy
