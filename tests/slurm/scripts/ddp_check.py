"""Test script for the SLURM end-to-end tests (not part of the package).

Each rank prints how trainscale sees it (ENV line), trains a tiny model with DDP on data that differs
per rank, and prints a checksum of its final parameters (CHECKSUM line): equal on every rank when
the gradients were really averaged across the whole world. ``--fail-rank R`` makes rank R raise.
"""

from __future__ import annotations

import argparse
import hashlib
import os

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import trainscale


def checksum(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--fail-rank", type=int, default=None)
    args = ap.parse_args()
    with trainscale.init(device="cpu", seed=0, timeout_s=60) as rt:
        seen = " ".join(f"{k}={os.environ.get(k, '-')}" for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK"))
        print(f"ENV rank={rt.rank} local_rank={rt.local_rank} node_rank={rt.node_rank} world={rt.world_size} "
              f"local_world={rt.local_world_size} source={rt.env.source} node={os.environ.get('SLURMD_NODENAME', '-')} "
              f"{seen}", flush=True)
        model = torch.nn.Linear(8, 2)
        ddp = DDP(model) if rt.is_distributed else model
        opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(100 + rt.rank)  # every rank sees different data
        start = checksum(model)
        for step in range(args.steps):
            x, y = torch.randn(16, 8, generator=gen), torch.randn(16, 2, generator=gen)
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step == 1 and args.fail_rank == rt.rank:
                raise RuntimeError(f"deliberate failure on rank {rt.rank} at step {step}")
        print(f"CHECKSUM rank={rt.rank} start={start} final={checksum(model)}", flush=True)


if __name__ == "__main__":
    main()
