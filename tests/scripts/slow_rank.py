"""A plain 2-rank DDP script (no trainscale import) whose rank 1 loses SLOW_S seconds per step in one place,
SLOW=loader | between | forward | backward | after_step | clean, each in its own function (the line marked
``# place: <SLOW>``: where the stack sampler must find it). ``between`` is nanoGPT's loop (no DataLoader:
the next batch fetched between forward and backward); the others read a DataLoader. ACCUM micro-batches per
optimizer step (DDP's no_sync on all but the last). Run it with `trainscale run --nproc-per-node 2`."""

import contextlib
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

SLOW = os.environ.get("SLOW", "clean")
SLOW_S = float(os.environ.get("SLOW_S", "0.04"))
STEPS = int(os.environ.get("STEPS", "14"))
ACCUM = int(os.environ.get("ACCUM", "1"))
BATCH = 8


class SlowBackward(torch.autograd.Function):
    """The identity, whose backward sleeps: time lost inside backward, before DDP's all-reduce."""

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
        self.a, self.b = torch.nn.Linear(32, 64), torch.nn.Linear(64, 1)

    def forward(self, x):
        h = torch.relu(self.a(x))
        if self.slow == "forward":
            time.sleep(SLOW_S)  # place: forward
        if self.slow == "backward":
            h = SlowBackward.apply(h)
        return self.b(h)


def log_step():
    """After the optimizer step: a script's own logging, say."""
    time.sleep(SLOW_S)  # place: after_step


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    slow = SLOW if rank == 1 else "clean"
    torch.manual_seed(0)
    model = DistributedDataParallel(Net(slow))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(rank)

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
            with model.no_sync() if micro < ACCUM - 1 else contextlib.nullcontext():
                loss = F.mse_loss(model(x), y) / ACCUM
                if batches is None:
                    x, y = get_batch()
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if slow == "after_step":
            log_step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
