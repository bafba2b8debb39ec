"""Seed 004's CNN on MNIST-shaped digits, run unchanged from one CPU process to many nodes.

trainscale run --nproc-per-node 2 --workload cnn --epochs 5 --batch-size 16 --lr 0.001
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from torch import nn

from trainscale.workloads.classify import check, run


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
    return run(sys.argv[1:] if argv is None else argv, "cnn", lambda _: CNN())


def preflight(argv: list[str], world_size: int, *, gpus: bool | None = None) -> None:
    check(argv, world_size, "cnn", lambda _: CNN(), gpus=gpus)


if __name__ == "__main__":
    main()
