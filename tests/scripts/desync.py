"""A plain gloo script (no trainscale import) whose rank 1 skips a collective (``skip``), adds one (``extra``),
passes another shape (``shape``) or, with the same shapes, one collective fewer (``silent``) at step 3, each at
the line marked ``# desync: <HOW>``. Run it with `trainscale run --nproc-per-node 2 desync.py HOW`."""

import sys
import time

import torch
import torch.distributed as dist

how = sys.argv[1]
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(300):
    model(torch.ones(2, 4)).sum().backward()
    for p in model.parameters():
        if not (how == "skip" and rank == 1 and step == 3):
            dist.all_reduce(p.grad)  # desync: skip
    if how == "extra" and rank == 1 and step == 3:
        dist.all_reduce(torch.ones(1))  # desync: extra
    dist.all_reduce(torch.ones(1 if how == "shape" and rank == 1 and step == 3 else 2))  # desync: shape
    if how == "silent" and not (rank == 1 and step == 3):
        dist.all_reduce(torch.ones(3))  # desync: silent
    opt.step()
    opt.zero_grad()
    time.sleep(0.1)
