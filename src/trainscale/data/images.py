"""MNIST-shaped image data: real MNIST (IDX files), the shipped digits (offline default), synthetic.

Every source returns float tensors already normalised with MNIST's mean/std, shape (N, 1, 28, 28),
and int64 labels: the per-sample ToTensor/Normalize work is done once, for the whole set.
"""

from __future__ import annotations

import gzip
import os
import struct
import urllib.request
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from trainscale.errors import ConfigError, did_you_mean

MNIST_MEAN, MNIST_STD = 0.1307, 0.3081
MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
# Real download path, kept for users with a network (never used by tests or CI).
MNIST_MIRROR = "https://ossci-datasets.s3.amazonaws.com/mnist/"
SOURCES = ("digits", "mnist", "synthetic")


@dataclass(frozen=True)
class ImageSplit:
    images: torch.Tensor
    labels: torch.Tensor

    def __len__(self) -> int:
        return self.labels.shape[0]


def normalise(images_0_1: torch.Tensor) -> torch.Tensor:
    return (images_0_1 - MNIST_MEAN) / MNIST_STD


def read_idx(path: Path) -> torch.Tensor:
    """Read an IDX file (optionally .gz), the format MNIST ships in."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as fh:
        data = fh.read()
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code != 0x08:
        raise ConfigError(f"{path} is not an unsigned-byte IDX file", hint="point --data-dir at the MNIST IDX files")
    dims = struct.unpack(">" + "I" * ndim, data[4 : 4 + 4 * ndim])
    payload = torch.frombuffer(bytearray(data[4 + 4 * ndim :]), dtype=torch.uint8)
    return payload.reshape(dims)


def _find(root: Path, stem: str) -> Path | None:
    return next(
        (
            c
            for c in (
                root / stem,
                root / f"{stem}.gz",
                root / "MNIST" / "raw" / stem,
                root / "MNIST" / "raw" / f"{stem}.gz",
            )
            if c.exists()
        ),
        None,
    )


def mnist_present(root: Path) -> bool:
    return all(_find(root, stem) for pair in MNIST_FILES.values() for stem in pair)


def download_mnist(root: Path) -> None:  # pragma: no cover - needs a network
    """Fetch the four MNIST files into ``root`` (call it inside ``runtime.rank_zero_first()``)."""
    root.mkdir(parents=True, exist_ok=True)
    for pair in MNIST_FILES.values():
        for stem in pair:
            target = root / f"{stem}.gz"
            if not target.exists():
                tmp = target.with_suffix(".part")
                urllib.request.urlretrieve(MNIST_MIRROR + f"{stem}.gz", tmp)
                os.replace(tmp, target)


def load_mnist(root: Path, split: str) -> ImageSplit:
    img_stem, lbl_stem = MNIST_FILES[split]
    img_path, lbl_path = _find(root, img_stem), _find(root, lbl_stem)
    if img_path is None or lbl_path is None:
        raise ConfigError(
            f"MNIST files not found under {root}",
            hint="pass --download to fetch them (needs a network), or use --data digits",
        )
    images = read_idx(img_path).to(torch.float32).div_(255.0).unsqueeze(1)
    return ImageSplit(normalise(images), read_idx(lbl_path).to(torch.int64))


DIGITS = "digits.npz"
"""The 1,797 8x8 handwritten digits of the UCI "Optical Recognition of Handwritten Digits" set (CC BY 4.0;
the copy scikit-learn ships as load_digits), shipped with trainscale: the default data needs nothing optional."""


def load_digits_28(split: str, test_fraction: float = 0.2) -> ImageSplit:
    """The 1,797 8x8 digits, upscaled to 28x28 so MNIST models apply unchanged."""
    with resources.files("trainscale.data").joinpath(DIGITS).open("rb") as fh:
        data = np.load(fh)
        raw_images, raw_labels = data["images"], data["target"]
    images = torch.tensor(raw_images, dtype=torch.float32).div_(16.0).unsqueeze(1)
    images = F.interpolate(images, size=(28, 28), mode="bilinear", align_corners=False)
    labels = torch.tensor(raw_labels, dtype=torch.int64)
    # A fixed, seed-independent split so every rank and every run sees the same sets.
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(1234))
    n_test = int(len(labels) * test_fraction)
    chosen = order[:n_test] if split == "test" else order[n_test:]
    return ImageSplit(normalise(images[chosen]), labels[chosen])


def synthetic_images(
    n: int, *, seed: int = 0, num_classes: int = 10, size: int = 28, channels: int = 1, split: str = "train"
) -> ImageSplit:
    """Learnable random data: each class has its own mean image (fixed by ``seed``) plus noise.

    Train and test splits share the class images and differ in their samples, so held-out
    accuracy measures learning.
    """
    if n < 1:
        raise ConfigError(f"synthetic data size {n} must be >= 1", hint="pass --samples N with N > 0")
    prototypes = torch.randn(num_classes, channels, size, size, generator=torch.Generator().manual_seed(seed))
    gen = torch.Generator().manual_seed(seed * 1000 + (1 if split == "test" else 2))
    labels = torch.randint(0, num_classes, (n,), generator=gen)
    images = prototypes[labels] + 0.8 * torch.randn(n, channels, size, size, generator=gen)
    return ImageSplit(images, labels)


def load_images(
    source: str, split: str, *, data_dir: str | None = None, samples: int = 60000, seed: int = 0
) -> ImageSplit:
    if source not in SOURCES:
        raise ConfigError(f"unknown data source {source!r}", hint=did_you_mean(source, SOURCES))
    if source == "digits":
        return load_digits_28(split)
    if source == "synthetic":
        n = samples if split == "train" else max(1, samples // 6)
        return synthetic_images(n, seed=seed, split=split)
    root = Path(data_dir or os.environ.get("TRAINSCALE_DATA", "./data"))
    return load_mnist(root, split)
