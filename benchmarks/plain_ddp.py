"""The cnn workload written by hand with plain torch.distributed + DDP (for benchmarks/overhead.py).

Same model (trainscale's CNN class), same data tensors, same per-rank batch and steps, sharded by a
DistributedSampler-style permutation; launched with `python -m torch.distributed.run`.
"""

import argparse
import json
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from trainscale.data.images import load_images
from trainscale.workloads.cnn import CNN

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--batch-size", type=int, default=16)
p.add_argument("--out", required=True)
args = p.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
train = load_images("digits", "train", samples=60000, seed=0)
model = DDP(CNN())
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
per_rank = len(train) // world
steps_per_epoch = per_rank // args.batch_size
elapsed, steps = 0.0, 0
for epoch in range(args.epochs):
    g = torch.Generator().manual_seed(epoch)
    order = torch.randperm(len(train), generator=g)[rank : world * per_rank : world]
    loss_sum = torch.zeros(())
    t0 = time.perf_counter()
    for i in range(steps_per_epoch):
        idx = order[i * args.batch_size : (i + 1) * args.batch_size]
        x, y = train.images[idx], train.labels[idx]
        loss = F.nll_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        loss_sum += loss.detach()
        steps += 1
    t = torch.tensor([time.perf_counter() - t0])
    dist.all_reduce(t)
    elapsed += float(t) / world
if rank == 0:
    with open(args.out, "w") as fh:
        json.dump({"steps": steps, "train_time_s": elapsed, "step_time_s": elapsed / steps}, fh)
dist.destroy_process_group()
