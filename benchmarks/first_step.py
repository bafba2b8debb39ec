"""A trivial torchrun-compatible script: join the process group, do one all-reduce (the "first step"),
record when it finished. Plain torch only, so `torchrun` and `trainscale run` start exactly the same thing."""

import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 0:
    with open(sys.argv[1], "w") as fh:
        fh.write(repr(time.time()))
dist.destroy_process_group()
