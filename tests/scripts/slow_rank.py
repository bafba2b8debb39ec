"""A plain DDP / ZeRO-1 / FSDP2 script (no trainscale import) whose rank 1 loses SLOW_S seconds per step in one
place, SLOW=loader | between | forward | backward | optimizer | after_step | eval | checkpointed | clean, each in its
own function (the line marked ``# place: <SLOW>``: where the stack sampler must find it). ``between`` is nanoGPT's
loop (no DataLoader: the next batch fetched between forward and backward); the others read a DataLoader.
``eval`` is rank 0's evaluation between steps (the others wait for it). ``checkpointed``: every rank runs a block
under activation checkpointing (``torch.utils.checkpoint``, recomputed in backward), rank 1's slow by half SLOW_S
each time it runs: in its forward and again in its backward. ACCUM micro-batches per optimizer step
(no gradient sync on all but the last). STRATEGY=ddp (DistributedDataParallel), zero1 (DDP with
ZeroRedundancyOptimizer), fsdp (FSDP2's ``fully_shard`` on each layer and the model: all-gathers in forward) or
deepspeed:stage=N (DeepSpeed's engine, ZeRO stage N, its own loop: ``engine.backward``, ``engine.step``).
BIND=1 pins each rank to a CPU of its own; WIDTH and BATCH make its compute larger; LOG=1 all-reduces the loss
after each step for printing, as course scripts do; EVERY=N evaluates every N steps only (``eval``);
SLOW=eval_all: every rank evaluates (``EVERY``); SLOW=turns: each step one rank loses SLOW_S after its step
(``log_step``), the ranks in an order drawn alike on every rank for each round of world-size steps: each rank
once a round (a free draw each step had rank 0 late in 18 of 20 steps: a straggler for that while).
Run it with `trainscale run --nproc-per-node 2` (or 4)."""

import contextlib
import os
import random
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader, TensorDataset

SLOW = os.environ.get("SLOW", "clean")
SLOW_S = float(os.environ.get("SLOW_S", "0.04"))
STEPS = int(os.environ.get("STEPS", "14"))
ACCUM = int(os.environ.get("ACCUM", "1"))
STRATEGY = os.environ.get("STRATEGY", "ddp")
BATCH = int(os.environ.get("BATCH", "8"))
WIDTH = int(os.environ.get("WIDTH", "64"))
EVERY = int(os.environ.get("EVERY", "1"))


class SlowBackward(torch.autograd.Function):
    """The identity, whose backward sleeps: time lost inside backward, before the gradients' collective."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        time.sleep(SLOW_S)  # place: backward
        return grad


class Net(torch.nn.Module):
    def __init__(self, slow: str):
        super().__init__()
        self.slow = slow
        self.a, self.b = torch.nn.Linear(32, WIDTH), torch.nn.Linear(WIDTH, 1)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if self.slow == "forward":
            time.sleep(SLOW_S)  # place: forward
        if self.slow == "backward":
            h = SlowBackward.apply(h)
        if SLOW == "checkpointed":  # every rank's, recomputed in backward
            h = checkpoint(self.block, h, use_reentrant=False)
        return self.b(h)

    def block(self, h):
        if self.slow == "checkpointed":
            time.sleep(SLOW_S / 2)  # place: checkpointed
        return torch.tanh(h)


def log_step():
    """After the optimizer step: a script's own logging, say."""
    time.sleep(SLOW_S)  # place: after_step


def evaluate():
    """Rank 0's evaluation between steps (the others go on to the next step's collective and wait)."""
    time.sleep(SLOW_S)  # place: eval


class SlowSGD(torch.optim.SGD):
    """An optimizer whose step takes longer on this rank (a costlier update, say)."""

    def step(self, closure=None):
        time.sleep(SLOW_S)  # place: optimizer
        return super().step(closure)


def wrap(net, optimizer):
    """The model and its optimizer as the strategy makes them."""
    if STRATEGY.startswith("deepspeed"):
        import deepspeed

        config = {
            "train_micro_batch_size_per_gpu": BATCH,
            "gradient_accumulation_steps": ACCUM,
            "zero_optimization": {"stage": int(STRATEGY.rpartition("=")[2] or 1)},
            "zero_allow_untested_optimizer": True,
        }
        engine, opt, _, _ = deepspeed.initialize(
            model=net, optimizer=optimizer(net.parameters(), lr=0.01), config=config
        )
        return engine, opt
    if STRATEGY == "fsdp":
        from torch.distributed.fsdp import fully_shard

        fully_shard(net.a)
        fully_shard(net.b)
        model = fully_shard(net)
        return model, optimizer(model.parameters(), lr=0.01)
    model = DistributedDataParallel(net)
    if STRATEGY == "zero1":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=optimizer, lr=0.01)
    return model, optimizer(model.parameters(), lr=0.01)


def no_sync(model, last):
    if STRATEGY.startswith("deepspeed"):  # the engine counts its micro-batches itself
        return contextlib.nullcontext()
    if STRATEGY == "fsdp":
        model.set_requires_gradient_sync(last)
        return contextlib.nullcontext()
    return model.no_sync() if not last else contextlib.nullcontext()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    if os.environ.get("BIND") == "1":  # a CPU of its own (the benchmark's busy kind spins on rank 1's)
        os.sched_setaffinity(0, {rank % os.cpu_count()})
    slow = SLOW if rank == (0 if SLOW == "eval" else 1) else "clean"
    slow = "eval" if SLOW == "eval_all" else slow  # every rank evaluates (an HF Trainer's distributed evaluation)
    torch.manual_seed(0)
    model, opt = wrap(Net(slow), SlowSGD if slow == "optimizer" else torch.optim.SGD)
    generator = torch.Generator().manual_seed(rank)
    turns, order = random.Random(0), []  # SLOW=turns: each round of world-size steps, each rank once, in a drawn order

    def get_batch():  # nanoGPT's: a batch made on the spot, no DataLoader
        if slow == "between":
            time.sleep(SLOW_S)  # place: between
        return torch.randn(BATCH, 32, generator=generator), torch.randn(BATCH, 1, generator=generator)

    def collate(items):
        if slow == "loader":
            time.sleep(SLOW_S / ACCUM)  # place: loader
        return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])

    data = TensorDataset(torch.randn(BATCH * STEPS * ACCUM, 32), torch.randn(BATCH * STEPS * ACCUM, 1))
    batches = iter(DataLoader(data, batch_size=BATCH, collate_fn=collate)) if SLOW != "between" else None
    x, y = get_batch() if batches is None else (None, None)
    for _ in range(STEPS):
        for micro in range(ACCUM):
            if batches is not None:
                x, y = next(batches)
            with no_sync(model, micro == ACCUM - 1):
                loss = F.mse_loss(model(x), y) / ACCUM
                if batches is None:
                    x, y = get_batch()
                if STRATEGY.startswith("deepspeed"):
                    model.backward(loss)
                    model.step()  # the optimizer's at the last micro-batch of a step
                else:
                    loss.backward()
        if not STRATEGY.startswith("deepspeed"):
            opt.step()
            opt.zero_grad(set_to_none=True)
        if os.environ.get("LOG") == "1":  # the mean loss for printing: a collective after the step
            mean = loss.detach() * ACCUM
            dist.all_reduce(mean)
            if rank == 0 and _ % 10 == 0:
                print(f"step {_} loss {mean.item() / dist.get_world_size():.4f}", flush=True)
        if slow == "after_step":
            log_step()
        if SLOW == "turns":
            order = order or turns.sample(range(dist.get_world_size()), dist.get_world_size())  # alike on all ranks
            if order.pop() == rank:
                log_step()
        if slow == "eval" and (_ + 1) % EVERY == 0:  # EVERY steps (each, by default)
            evaluate()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
