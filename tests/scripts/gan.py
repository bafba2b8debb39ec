"""PyTorch's DCGAN tutorial's loop in DDP (no trainscale import): a discriminator and a generator, each in DDP
with an optimizer of its own, so two optimizer steps an iteration — the discriminator's on a real and a fake
batch, then the generator's through the discriminator. SLOW=G makes rank 1's generator forward SLOW_S longer
(once an iteration: in every other step), SLOW=D its discriminator forward SLOW_S / 3 longer (three times an
iteration: every step). Run it with `trainscale run --nproc-per-node 2`."""

import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

SLOW = os.environ.get("SLOW", "clean")
SLOW_S = float(os.environ.get("SLOW_S", "0.04"))
STEPS = int(os.environ.get("STEPS", "60"))


class Discriminator(torch.nn.Module):
    def __init__(self, slow: bool):
        super().__init__()
        self.slow = slow
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.LeakyReLU(0.2), torch.nn.Linear(128, 1))

    def forward(self, x):
        if self.slow:
            time.sleep(SLOW_S / 3)  # place: D
        return self.net(x)


class Generator(torch.nn.Module):
    def __init__(self, slow: bool):
        super().__init__()
        self.slow = slow
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64))

    def forward(self, z):
        if self.slow:
            time.sleep(SLOW_S)  # place: G
        return self.net(z)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    netD = DistributedDataParallel(Discriminator(rank == 1 and SLOW == "D"))
    netG = DistributedDataParallel(Generator(rank == 1 and SLOW == "G"))
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    criterion = torch.nn.BCEWithLogitsLoss()
    generator = torch.Generator().manual_seed(rank)
    real_label, fake_label = torch.ones(32, 1), torch.zeros(32, 1)
    for _ in range(STEPS):
        real = torch.randn(32, 64, generator=generator)
        netD.zero_grad()
        criterion(netD(real), real_label).backward()
        fake = netG(torch.randn(32, 16, generator=generator))
        criterion(netD(fake.detach()), fake_label).backward()
        optD.step()
        netG.zero_grad()
        criterion(netD(fake), real_label).backward()
        optG.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
