"""Seed 004's CPU script, as it writes it: per-sample ToTensor + Normalize through a DataLoader, batch 16.

torchvision is not a dependency here, so its two transforms are written out exactly as they work:
PIL image -> float tensor in [0, 1] with a channel axis (ToTensor), then (x - 0.1307) / 0.3081
(Normalize). The images are the same digits trainscale's cnn workload trains on, kept as uint8 PIL
images like torchvision's MNIST dataset keeps them. Used by benchmarks/seed_style.py.
"""

import argparse
import json
import time

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from trainscale.data.images import MNIST_MEAN, MNIST_STD, load_images
from trainscale.workloads.cnn import CNN


def to_tensor(img: Image.Image) -> torch.Tensor:  # torchvision.transforms.ToTensor for a mode-L image
    return torch.from_numpy(np.array(img, dtype=np.uint8)).unsqueeze(0).float().div(255)


def normalize(t: torch.Tensor) -> torch.Tensor:  # torchvision.transforms.Normalize((0.1307,), (0.3081,))
    return (t - MNIST_MEAN) / MNIST_STD


class PILDigits(Dataset):
    def __init__(self, split: str) -> None:
        s = load_images("digits", split)
        raw = (s.images * MNIST_STD + MNIST_MEAN).clamp(0, 1).mul(255).round().to(torch.uint8)
        self.images = [Image.fromarray(a.squeeze(0).numpy(), mode="L") for a in raw]
        self.targets = s.labels.tolist()

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, i):
        return normalize(to_tensor(self.images[i])), self.targets[i]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    torch.manual_seed(0)
    loader = DataLoader(PILDigits("train"), batch_size=a.batch_size, shuffle=True)
    test_loader = DataLoader(PILDigits("test"), batch_size=1000)
    model = CNN()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    data_s, total_s, steps = 0.0, 0.0, 0
    for epoch in range(a.epochs):
        model.train()
        t0 = time.perf_counter()
        it = iter(loader)
        while True:
            d0 = time.perf_counter()
            batch = next(it, None)
            data_s += time.perf_counter() - d0
            if batch is None:
                break
            x, y = batch
            opt.zero_grad()
            loss = F.nll_loss(model(x), y)
            loss.backward()
            opt.step()
            steps += 1
        total_s += time.perf_counter() - t0
        model.eval()  # the seed's test() after every epoch
        correct = 0
        with torch.no_grad():
            for x, y in test_loader:
                correct += int((model(x).argmax(1) == y).sum())
        print(
            f"Epoch {epoch + 1}: loss {loss.item():.4f}, accuracy {correct / len(test_loader.dataset):.2%}, "
            f"{time.perf_counter() - t0:.2f}s",
            flush=True,
        )
    with open(a.out, "w") as fh:
        json.dump({"steps": steps, "train_time_s": total_s, "data_s": data_s}, fh)


if __name__ == "__main__":
    main()
