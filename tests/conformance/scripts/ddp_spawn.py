"""PyTorch's DDP tutorial (ddp_tutorial.rst, "Basic Use Case") as it is written: the script starts its own ranks
with ``torch.multiprocessing.spawn`` and names its own MASTER_ADDR and MASTER_PORT, run as ``python script.py``.
Nothing of trainscale. OUT: where each rank writes its JSON; PORT: the port its rank 0 hosts its store on."""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common_data import checksum, report  # noqa: E402


def setup(rank, world_size):
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = os.environ.get("PORT", "12355")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


class ToyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = torch.nn.Linear(10, 10)
        self.relu = torch.nn.ReLU()
        self.net2 = torch.nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


def demo_basic(rank, world_size):
    print(f"Running basic DDP example on rank {rank}.", flush=True)
    setup(rank, world_size)
    torch.manual_seed(0)
    ddp_model = DDP(ToyModel())
    loss_fn = torch.nn.MSELoss()
    optimizer = torch.optim.SGD(ddp_model.parameters(), lr=0.001)
    g = torch.Generator().manual_seed(rank)
    for _ in range(10):
        optimizer.zero_grad()
        outputs = ddp_model(torch.randn(20, 10, generator=g))
        loss_fn(outputs, torch.randn(20, 5, generator=g)).backward()
        optimizer.step()
    report(os.environ["OUT"], rank=rank, world_size=world_size, checksum=checksum(ddp_model.module))
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(demo_basic, args=(2,), nprocs=2, join=True)
