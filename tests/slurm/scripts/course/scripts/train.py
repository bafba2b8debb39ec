"""A course layout (the tutorials' folders): this script lives in scripts/ and imports its model from
the sibling package mypkg/, which it reaches by extending sys.path relative to its own file. Run under
torchrun or as one srun task per rank, it takes one DDP-style step, then writes what it saw (its
arguments, where mypkg came from, which Python ran it) to OUTPUT_PATH/rank-R.json."""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.append(os.path.join(os.path.dirname(__file__), ".."))
import mypkg  # noqa: E402
from mypkg.model import CNN_classifier  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description="one training step of the course's CNN")
    parser.add_argument("--output-path", required=True, help="where each rank writes what it saw")
    parser.add_argument("--note", default="", help="free text, kept as given")
    args = parser.parse_args()

    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo", init_method="env://")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = CNN_classifier()
    data = torch.randn(8, 1, 28, 28, generator=torch.Generator().manual_seed(rank))
    model(data).sum().backward()
    grad = model.fc.weight.grad.clone()
    dist.all_reduce(grad)
    if rank == 0:
        print(f"Model from {mypkg.__file__}, world size {world_size}", flush=True)

    os.makedirs(args.output_path, exist_ok=True)
    with open(os.path.join(args.output_path, f"rank-{rank}.json"), "w") as f:
        json.dump({"rank": rank, "world_size": world_size, "argv": sys.argv[1:], "mypkg": mypkg.__file__,
                   "script": os.path.abspath(__file__), "python": sys.executable,
                   "grad_sum": round(float(grad.sum()), 4)}, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
