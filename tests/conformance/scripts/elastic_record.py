"""Course-style elastic script (seed 003): @record on main, so a failing worker's traceback lands in
TORCHELASTIC_ERROR_FILE; resumes from its own checkpoint when torchrun restarts the group.
``--fail-rank R --fail-attempts K`` makes rank R raise in the first K attempts."""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

from common_data import report


@record
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-attempts", type=int, default=0)
    args = parser.parse_args()
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    state_file = os.path.join(args.out, "state.json")
    state = {"step": 0}
    if os.path.exists(state_file):
        with open(state_file) as fh:
            state = json.load(fh)
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    if rank == args.fail_rank and attempt < args.fail_attempts:
        raise RuntimeError(f"deliberate failure on rank {rank} in attempt {attempt}")
    state["step"] += 1
    dist.barrier()
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        with open(state_file, "w") as fh:
            json.dump(state, fh)
    report(args.out, rank=rank, world_size=world, attempt=attempt, total=value.item(), step=state["step"])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
