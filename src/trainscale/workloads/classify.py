"""Image classification on MNIST-shaped data (cnn, vit): what seed 004 writes by hand four times is a
model, its data, a loss and a held-out check here; the training loop (train/loop.py) does the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

import trainscale
from trainscale.data import DeviceTensorLoader, DistributedLoader
from trainscale.data.images import ImageSplit, download_mnist, load_images, mnist_present
from trainscale.strategies.base import OptimizerSpec
from trainscale.train import Loop, Task, TrainOptions, parse
from trainscale.train.options import apply_threads, check_training

Builder = Callable[[Any], nn.Module]
"""A workload's model from its own options (its ``workload`` dataclass; None for a workload without any)."""


def make_loader(split: ImageSplit, opts: TrainOptions, rt, shuffle: bool):
    if opts.loader == "tensor":
        return DeviceTensorLoader.for_runtime(
            split.images, split.labels, runtime=rt, batch_size=opts.batch_size, shuffle=shuffle
        )
    dataset = torch.utils.data.TensorDataset(split.images, split.labels)
    return DistributedLoader.for_runtime(
        dataset, rt, batch_size=opts.batch_size, shuffle=shuffle, num_workers=opts.num_workers
    )


@torch.no_grad()
def evaluate(model: nn.Module, split: ImageSplit, rt, batch_size: int = 512) -> dict[str, float]:
    """Mean loss and accuracy on the held-out split, each rank on its shard, reduced over ranks."""
    model.eval()
    n = len(split)
    mine = torch.arange(rt.rank, n, rt.world_size)
    loss_sum, correct = 0.0, 0.0
    for i in range(0, len(mine), batch_size):
        idx = mine[i : i + batch_size]
        x, y = split.images[idx].to(rt.device), split.labels[idx].to(rt.device)
        out = model(x)
        loss_sum += float(nn.functional.nll_loss(out, y, reduction="sum"))
        correct += float((out.argmax(1) == y).sum())
    model.train()
    return {"test_loss": rt.sum(loss_sum) / n, "accuracy": rt.sum(correct) / n}


def _split(opts: TrainOptions, part: str) -> ImageSplit:
    return load_images(opts.data, part, data_dir=opts.data_dir, samples=opts.samples, seed=opts.seed)


def run(
    argv: list[str], name: str, build: Builder, *, defaults: TrainOptions | None = None, workload: type | None = None
) -> dict:
    """Parse ``argv`` and train ``build``'s model on every rank of this launch."""
    opts, own = parse(
        argv, prog=f"trainscale run [launch options] --workload {name}", defaults=defaults, workload=workload
    )
    with trainscale.init(**opts.runtime_options()) as rt:
        apply_threads(opts, rt)
        if opts.data == "mnist" and opts.download:
            with rt.rank_zero_first():
                root = Path(opts.data_dir or "./data")
                if rt.is_main and not mnist_present(root):
                    download_mnist(root)
        train, test = _split(opts, "train"), _split(opts, "test")

        def loss(model: nn.Module, batch) -> torch.Tensor:
            x, y = batch[0].to(rt.device, non_blocking=True), batch[1].to(rt.device, non_blocking=True)
            return nn.functional.nll_loss(model(x), y)

        task = Task(
            name=name,
            model=lambda: build(own),
            optimizer=OptimizerSpec(torch.optim.Adam, {"lr": opts.lr}),
            loss=loss,
            loader=make_loader(train, opts, rt, opts.shuffle),
            samples=len(train),
            evaluate=lambda model: evaluate(model, test, rt),
        )
        return Loop(rt, opts, task).run()


def check(
    argv: list[str],
    world_size: int,
    name: str,
    build: Builder,
    *,
    gpus: bool | None = None,
    defaults: TrainOptions | None = None,
    workload: type | None = None,
) -> None:
    """Check the options, the model's shape and that the data can feed every rank, before any process
    is launched."""
    opts, own = parse(
        argv, prog=f"trainscale run [launch options] --workload {name}", defaults=defaults, workload=workload
    )
    build(own)
    check_training(
        opts,
        world_size,
        gpus=gpus,
        samples=len(_split(opts, "train")),
        what=f"'{opts.data}' training set",
        checkpoint_dir=opts.checkpoint_dir,
    )
