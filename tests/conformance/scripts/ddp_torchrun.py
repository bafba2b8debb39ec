"""Course-style DDP with torchrun (seeds 002/003): torchrun's variables, rank-0-first download and
experiment directory, DistributedSampler, DDP, rank-0 checkpoint. Run it with torchrun, or with
`trainscale run` and the same options."""

import argparse
import os
import time
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from common_data import checksum, download, load, report


@contextmanager
def rank0_first():
    rank = dist.get_rank()
    if rank == 0:
        yield
    dist.barrier()
    if rank > 0:
        yield
    dist.barrier()


def make_model():
    return torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.MaxPool2d(4), torch.nn.Flatten(),
                               torch.nn.Linear(8 * 6 * 6, 10), torch.nn.LogSoftmax(dim=1))


@record
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--experiment-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()

    torch.manual_seed(0)
    dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.cuda.is_available():
        device = torch.device(f"cuda:{local_rank}")
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    print(f"rank={rank} world size={world_size}", flush=True)

    exp_dir = args.experiment_dir
    dist.barrier()
    if rank == 0:
        os.makedirs(exp_dir, exist_ok=True)
    dist.barrier()
    with rank0_first():
        download(os.path.join(exp_dir, "data"))
        dataset = load(os.path.join(exp_dir, "data"))

    model = make_model().to(device)
    model = DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    sampler = DistributedSampler(dataset, shuffle=True, drop_last=True)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    seen = 0
    start = time.time()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            loss = torch.nn.functional.nll_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += len(x)
    if rank == 0:
        torch.save(model.module.state_dict(), os.path.join(exp_dir, "model.pt"))
        print(f"Training time = {time.time() - start}", flush=True)
    dist.barrier()
    report(args.out, rank=rank, world_size=world_size, local_rank=local_rank, samples=seen,
           checksum=checksum(model.module), indices=list(sampler)[:4])
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
