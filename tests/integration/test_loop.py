"""The training loop's gradient accumulation on 2 gloo ranks: 2 micro-batches of 4 per rank equal one
process on the whole batch of 16 (<= 1e-6, plain SGD: the all-reduce sums in another order), and
the gradients of the first micro-batch stay local (no all-reduce before the last one)."""

from __future__ import annotations

import torch
from helpers.multiproc import run_on_ranks
from torch import nn

SAMPLES, WIDTH, STEPS = 64, 8, 4


def run_loop(per_rank_batch: int, accumulation: int) -> dict:
    import trainscale
    from trainscale.data import DeviceTensorLoader
    from trainscale.strategies.base import OptimizerSpec
    from trainscale.train import Loop, Task, TrainOptions

    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(SAMPLES, WIDTH, generator=g), torch.randint(0, 3, (SAMPLES,), generator=g)
    seen: list[float | None] = []  # the first weight's gradient as each micro-batch starts

    def loss(model, batch):
        grad = next(model.parameters()).grad
        seen.append(None if grad is None else float(grad.sum()))
        return nn.functional.cross_entropy(model(batch[0]), batch[1])

    with trainscale.init(seed=0, set_threads=False) as rt:
        loader = DeviceTensorLoader.for_runtime(x, y, runtime=rt, batch_size=per_rank_batch, shuffle=False)
        task = Task(
            name="mlp",
            loss=loss,
            loader=loader,
            samples=SAMPLES,
            model=lambda: nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 3)),
            optimizer=OptimizerSpec(torch.optim.SGD, {"lr": 0.5}),
        )
        opts = TrainOptions(max_steps=STEPS, epochs=1, batch_size=per_rank_batch, grad_accum=accumulation, log_every=0)
        result = Loop(rt, opts, task).run()
        return {
            "params": {k: v.detach().clone() for k, v in result["model"].state_dict().items()},
            "seen": seen,
            "steps": result["steps"],
            "samples_per_s": result["epochs"][0]["samples_per_s"],
        }


def test_accumulating_on_two_ranks_equals_one_process_on_the_whole_batch():
    whole = run_loop(16, 1)
    ranks = run_on_ranks(run_loop, 2, 4, 2)
    assert ranks[0]["steps"] == whole["steps"] == STEPS
    for key, ref in whole["params"].items():
        assert float((ranks[0]["params"][key] - ref).abs().max() / ref.abs().max()) <= 1e-6, key
        assert torch.equal(ranks[0]["params"][key], ranks[1]["params"][key])
    first, second = ranks[0]["seen"][0::2], ranks[0]["seen"][1::2]
    assert first == [None] * STEPS  # cleared after every optimizer step
    # before the second micro-batch each rank holds its own first micro-batch's gradient, unsynchronised
    assert all(a != b for a, b in zip(second, ranks[1]["seen"][1::2]))
