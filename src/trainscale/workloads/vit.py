"""Seed 002's Vision Transformer, small by default, on the same MNIST-shaped data as the CNN.

trainscale run --nproc-per-node 2 --workload vit --strategy fsdp --epochs 2
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trainscale.errors import ConfigError
from trainscale.train import TrainOptions
from trainscale.workloads.classify import check, run


class Block(nn.Module):
    """Pre-norm transformer encoder block: attention then MLP, each with a residual."""

    def __init__(self, width: int, heads: int, mlp_ratio: int = 4) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.norm2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, mlp_ratio * width), nn.GELU(), nn.Linear(mlp_ratio * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.norm1(x)
        x = x + self.attn(y, y, y, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


def check_shape(*, image_size: int, patch_size: int, width: int, heads: int) -> None:
    if image_size % patch_size:
        raise ConfigError(
            f"--patch-size {patch_size} does not divide the image size {image_size}",
            hint="use a divisor of 28, e.g. 4, 7 or 14",
        )
    if width % heads:
        raise ConfigError(f"--width {width} is not divisible by --heads {heads}", hint="e.g. --width 64 --heads 4")


class ViT(nn.Module):
    _no_split_modules = ("Block",)  # FSDP shards per transformer block (and the rest as the root)

    def __init__(
        self,
        *,
        image_size: int = 28,
        patch_size: int = 7,
        channels: int = 1,
        width: int = 64,
        depth: int = 4,
        heads: int = 4,
        num_classes: int = 10,
    ) -> None:
        super().__init__()
        check_shape(image_size=image_size, patch_size=patch_size, width=width, heads=heads)
        n_patches = (image_size // patch_size) ** 2
        self.patchify = nn.Conv2d(channels, width, kernel_size=patch_size, stride=patch_size)
        self.cls = nn.Parameter(torch.zeros(1, 1, width))
        self.pos = nn.Parameter(torch.randn(1, n_patches + 1, width) * 0.02)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.patchify(images).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        for block in self.blocks:
            x = block(x)
        return F.log_softmax(self.head(self.norm(x[:, 0])), dim=1)


@dataclass(frozen=True, kw_only=True)
class ViTOptions:
    """vit's own options, beside the common ones (the same [train] table and TRAINSCALE_TRAIN_ variables)."""

    patch_size: int = 7
    """Image patch side in pixels."""
    width: int = 64
    """Embedding width."""
    depth: int = 4
    """Transformer blocks."""
    heads: int = 4
    """Attention heads; must divide --width."""

    def __post_init__(self) -> None:
        check_shape(image_size=28, patch_size=self.patch_size, width=self.width, heads=self.heads)


DEFAULTS = TrainOptions(epochs=3, batch_size=32, lr=1e-3)


def build(own: ViTOptions) -> ViT:
    return ViT(patch_size=own.patch_size, width=own.width, depth=own.depth, heads=own.heads)


def main(argv: list[str] | None = None) -> dict:
    return run(sys.argv[1:] if argv is None else argv, "vit", build, defaults=DEFAULTS, workload=ViTOptions)


def preflight(argv: list[str], world_size: int, *, gpus: bool | None = None) -> None:
    check(argv, world_size, "vit", build, gpus=gpus, defaults=DEFAULTS, workload=ViTOptions)


if __name__ == "__main__":
    main()
