"""Course-style DDP launched one task per GPU by srun (seed 004, cnn_multinode.py): the rank comes
from SLURM_PROCID/SLURM_LOCALID, the world from the exported MASTER_ADDR/MASTER_PORT/WORLD_SIZE/
NODE_RANK, and the script calls init_process_group(init_method="env://") itself."""

import argparse
import os
import time

import torch
import torch.nn as nn
import torch.optim as optim
from torch.utils.data import DataLoader, DistributedSampler

from common_data import checksum, download, load, report

MASTER_ADDR = os.environ["MASTER_ADDR"]
MASTER_PORT = os.environ["MASTER_PORT"]
WORLD_SIZE = int(os.environ["WORLD_SIZE"])
NODE_RANK = int(os.environ["NODE_RANK"])


class CNN_classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 8, 3)
        self.fc = nn.Linear(8 * 13 * 13, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv(x)), 2)
        return nn.functional.log_softmax(self.fc(torch.flatten(x, 1)), dim=1)


def train(model, dataloader, sampler, args, device, rank):
    criterion = nn.NLLLoss()
    optimizer = optim.Adam(params=model.parameters(), lr=args.lr)
    model.train()
    seen = 0
    if rank == 0:
        print("Entering training loop...")
    for epoch in range(1, args.epochs + 1):
        sampler.set_epoch(epoch)
        for batch_idx, (data, target) in enumerate(dataloader):
            data = data.to(device)
            target = target.to(device)
            output = model(data)
            loss = criterion(output, target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            seen += len(data)
            if rank == 0 and batch_idx % 100 == 0:
                print(f'Train Epoch: {epoch} [{batch_idx * len(data)}/{len(dataloader.dataset)}]\tLoss: {loss.item():.6f}')
        torch.distributed.barrier()
    if rank == 0:
        print("Exiting training loop...")
    return seen


def worker(args):
    global_rank = int(os.environ["SLURM_PROCID"])
    local_rank = int(os.environ["SLURM_LOCALID"])
    print(f"Rank {global_rank} on Node {NODE_RANK}: Initializing process group.", flush=True)
    torch.distributed.init_process_group(
        backend="nccl" if torch.cuda.is_available() else "gloo",
        world_size=WORLD_SIZE,
        rank=global_rank,
        init_method="env://",
    )
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device(f"cuda:{local_rank}")
    else:
        device = torch.device("cpu")
    if local_rank == 0:
        download(args.data)  # once per node, as the seed's node-local download
    torch.distributed.barrier()
    train_dataset = load(args.data)
    train_sampler = DistributedSampler(train_dataset, num_replicas=WORLD_SIZE, rank=global_rank)
    train_loader = DataLoader(train_dataset, batch_size=args.batch_size, drop_last=True, sampler=train_sampler)
    torch.manual_seed(0)
    model = CNN_classifier().to(device)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if device.type == "cuda" else None)
    time_start = time.time()
    seen = train(model, train_loader, train_sampler, args, device, global_rank)
    if global_rank == 0:
        print(f"Training time = {time.time() - time_start}")
    report(args.out, rank=global_rank, world_size=WORLD_SIZE, local_rank=local_rank,
           node_rank=NODE_RANK, samples=seen, checksum=checksum(model.module))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="Pytorch on HPC")
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.001)
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    if NODE_RANK == 0 and int(os.environ["SLURM_PROCID"]) == 0:
        print(f"MASTER_ADDR: {MASTER_ADDR}\nMASTER_PORT: {MASTER_PORT}\nWORLD_SIZE: {WORLD_SIZE}\nNODE_RANK: {NODE_RANK}")
    worker(args=parser.parse_args())
