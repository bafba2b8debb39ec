"""Plain torch.distributed + DDP as seed 004's multinode_example.py and PyTorch's DDP tutorial write it: the
launcher's variables, init_process_group, DistributedSampler, DDP, a metric all-reduced every step. Nothing of
trainscale. Knobs for the tests (environment): STEPS; SLOW_RANK and SLOW_MS (that rank's data loading is slower
by that much per batch); HANG_RANK and HANG_STEP (that rank's data loading stops there); PG_TIMEOUT (seconds); INIT_METHOD (an older
course's ``tcp://host:port``, its rank and world size from the launcher's variables)."""

import datetime
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from common_data import checksum, report

STEPS = int(os.environ.get("STEPS", "50"))
SLOW_RANK, SLOW_MS = int(os.environ.get("SLOW_RANK", "-1")), float(os.environ.get("SLOW_MS", "0"))
HANG_RANK, HANG_STEP = int(os.environ.get("HANG_RANK", "-1")), int(os.environ.get("HANG_STEP", "-1"))


class Samples(Dataset):
    step = 0

    def __len__(self):
        return 8192

    def __getitem__(self, index):
        rank = dist.get_rank()
        if rank == HANG_RANK and Samples.step == HANG_STEP:
            time.sleep(3600)  # a stuck reader: NFS, a lock, a dead worker
        if rank == SLOW_RANK and index % 8 == 0:  # one sample per batch of 8
            time.sleep(SLOW_MS / 1000)
        g = torch.Generator().manual_seed(index)
        x = torch.randn(32, generator=g)
        return x, int(x.sum() > 0)


def main():
    by = {"init_method": os.environ["INIT_METHOD"], "rank": int(os.environ["RANK"]),
          "world_size": int(os.environ["WORLD_SIZE"])} if os.environ.get("INIT_METHOD") else {}
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                            timeout=datetime.timedelta(seconds=float(os.environ.get("PG_TIMEOUT", "1800"))), **by)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = Samples()
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=8, sampler=sampler)
    step = 0
    while step < STEPS:
        for x, y in loader:
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            mean = loss.detach().clone()
            dist.all_reduce(mean)  # the course scripts' "average the loss over ranks"
            step += 1
            Samples.step = step
            if rank == 0 and step % 10 == 0:
                print(f"step {step} loss {mean.item() / world:.4f}", flush=True)
            if step == STEPS:
                break
    report(os.environ["OUT"], rank=rank, world_size=world, local_rank=int(os.environ["LOCAL_RANK"]),
           checksum=checksum(model.module), steps=step)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
