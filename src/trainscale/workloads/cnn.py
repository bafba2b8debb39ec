"""Seed 004's CNN on MNIST-shaped digits, run unchanged from one CPU process to many nodes.

    trainscale run --nproc-per-node 2 --workload cnn --epochs 5 --batch-size 16 --lr 0.001
"""

from __future__ import annotations

import sys

import torch
from torch import nn
import torch.nn.functional as F

import trainscale
from trainscale.data.images import load_images
from trainscale.workloads.classify import train_classifier
from trainscale.workloads.options import parse, planned_device

DATA_SOURCES = "digits (scikit-learn, offline, default), mnist (IDX files in --data-dir), synthetic (--samples N)"


class CNN(nn.Module):
    """conv 1->32 k3, conv 32->64 k3, max-pool 2, fc 9216->128, fc 128->10, log-softmax."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.relu(self.fc1(torch.flatten(x, 1)))
        return F.log_softmax(self.fc2(x), dim=1)


def main(argv: list[str] | None = None) -> dict:
    from trainscale.strategies import process_group_backend

    opts, _ = parse(sys.argv[1:] if argv is None else argv, prog="trainscale-workload cnn")
    with trainscale.init(device=opts.device, backend=process_group_backend(opts.strategy), seed=opts.seed,
                         timeout_s=opts.timeout_s) as rt:
        if opts.data == "mnist" and opts.download:
            from pathlib import Path

            from trainscale.data.images import download_mnist, mnist_present

            with rt.rank_zero_first():
                root = Path(opts.data_dir or "./data")
                if rt.is_main and not mnist_present(root):
                    download_mnist(root)
        train = load_images(opts.data, "train", data_dir=opts.data_dir, samples=opts.samples, seed=opts.seed)
        test = load_images(opts.data, "test", data_dir=opts.data_dir, samples=opts.samples, seed=opts.seed)
        return train_classifier(rt, opts, CNN, train, test, "cnn")


def preflight(argv: list[str], world_size: int, *, gpus: bool | None = None) -> None:
    """Check the options and that the data can feed every rank, before any process is launched."""
    from trainscale.data import check_shardable
    from trainscale.strategies import check_strategy

    opts, _ = parse(argv, prog="trainscale-workload cnn")
    check_strategy(opts.strategy, world_size, batch_size=opts.batch_size,
                   device=planned_device(opts.device, gpus))
    train = load_images(opts.data, "train", data_dir=opts.data_dir, samples=opts.samples, seed=opts.seed)
    check_shardable(len(train), world_size, opts.batch_size, what=f"'{opts.data}' training set")


if __name__ == "__main__":
    main()
