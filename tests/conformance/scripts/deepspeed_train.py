"""Course-style DeepSpeed (seed 002, ds_visualtransformer.py): --local-rank and DeepSpeed's own
arguments (deepspeed.add_config_arguments), deepspeed.init_distributed(), deepspeed.initialize with
--deepspeed_config ds_config.json (trailing commas and all, as DeepSpeed reads it)."""

import argparse

import deepspeed
import torch

from common_data import checksum, download, load, report

parser = argparse.ArgumentParser()
parser.add_argument("--local-rank", type=int, default=-1, help="local rank passed from distributed launcher")
parser.add_argument("--data", required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--steps", type=int, default=4)
parser = deepspeed.add_config_arguments(parser)
args = parser.parse_args()

deepspeed.init_distributed()
rank = torch.distributed.get_rank()

if rank == 0:
    download(args.data)
torch.distributed.barrier()
train_dataset = load(args.data)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(28 * 28, 32), torch.nn.ReLU(), torch.nn.Linear(32, 10))
criterion = torch.nn.CrossEntropyLoss()

model_engine, optimizer, train_loader, _ = deepspeed.initialize(
    args=args, model=model, model_parameters=model.parameters(), training_data=train_dataset)

device = model_engine.local_rank if torch.cuda.is_available() else "cpu"
running_loss = 0.0
for step, (images, labels) in enumerate(train_loader):
    if step == args.steps:
        break
    images, labels = images.to(device), labels.to(device)
    optimizer.zero_grad()
    outputs = model_engine(images)
    loss = criterion(outputs, labels)
    model_engine.backward(loss)
    model_engine.step()
    running_loss += loss.item()

report(args.out, rank=rank, world_size=torch.distributed.get_world_size(), local_rank=model_engine.local_rank,
       steps=step, micro_batch=model_engine.train_micro_batch_size_per_gpu(), checksum=checksum(model_engine.module))
