"""The training loop shared by the image-classification workloads (cnn, vit).

What seed 004 writes by hand four times, written once: sharded data with the epoch advanced for
the user, DDP (or another strategy), rank-0 printing, mean-over-ranks metrics, checkpoints that
resume mid-epoch exactly, and per-epoch timings for the scaling study.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from trainscale.checkpoint import Checkpointer, atomic_write_text
from trainscale.data import DeviceTensorLoader, DistributedLoader
from trainscale.data.images import ImageSplit
from trainscale.errors import CheckpointError
from trainscale.runtime import Runtime
from trainscale.runtime.seed import rng_state, set_rng_state
from trainscale.runtime.memory import report as memory_report
from trainscale.strategies import get_strategy
from trainscale.strategies.base import OptimizerSpec
from trainscale.strategies.ddp import rebuild_buckets
from trainscale.workloads.options import TrainOptions
from trainscale.workloads import fault
from trainscale.workloads.timing import StepTimer


def make_loader(split: ImageSplit, opts: TrainOptions, rt: Runtime, shuffle: bool):
    if opts.loader == "tensor":
        return DeviceTensorLoader.for_runtime(split.images, split.labels, runtime=rt, batch_size=opts.batch_size,
                                              shuffle=shuffle)
    dataset = torch.utils.data.TensorDataset(split.images, split.labels)
    return DistributedLoader.for_runtime(dataset, rt, batch_size=opts.batch_size, shuffle=shuffle)


def progress_bar(fraction: float, width: int = 20) -> str:
    """A bar that reads well in a log file too (rank 0's output is usually redirected)."""
    filled = int(round(max(0.0, min(1.0, fraction)) * width))
    return "|" + "#" * filled + "-" * (width - filled) + "|"


def resume_position(state: dict, step: int, steps_per_epoch: int, world_size: int, path) -> tuple[int, int]:
    """(epoch, batch within it) to continue from; explains what to do when the world size changed mid-epoch."""
    saved_world = int(state["trainscale"]["world_size"])
    saved_epoch_steps = int(state.get("epoch_steps", steps_per_epoch))
    epoch, batch = divmod(step, saved_epoch_steps)
    if saved_world == world_size:
        return epoch, batch
    if batch == 0:  # an epoch boundary: the new world size simply shards the next epoch differently
        return epoch, 0
    raise CheckpointError(
        f"{path} was written by {saved_world} rank(s) in the middle of epoch {epoch + 1} (batch {batch}); "
        f"this run has {world_size} rank(s), which would split that epoch's remaining samples differently",
        hint=f"resume with --nproc-per-node/--nodes giving {saved_world} ranks, or resume from an end-of-epoch "
             f"checkpoint (save with --checkpoint-every 0); sharded strategies (fsdp) reshard any step",
    )


@torch.no_grad()
def evaluate(model: nn.Module, split: ImageSplit, rt: Runtime, batch_size: int = 512) -> tuple[float, float]:
    """(mean loss, accuracy) on the held-out split, each rank on its shard, reduced over ranks."""
    model.eval()
    n = len(split)
    mine = torch.arange(rt.rank, n, rt.world_size)
    loss_sum, correct = 0.0, 0.0
    for i in range(0, len(mine), batch_size):
        idx = mine[i:i + batch_size]
        x, y = split.images[idx].to(rt.device), split.labels[idx].to(rt.device)
        out = model(x)
        loss_sum += float(nn.functional.nll_loss(out, y, reduction="sum"))
        correct += float((out.argmax(1) == y).sum())
    model.train()
    return rt.sum(loss_sum) / n, rt.sum(correct) / n


def train_classifier(rt: Runtime, opts: TrainOptions, build_model: Callable[[], nn.Module],
                     train: ImageSplit, test: ImageSplit, name: str,
                     strategy_options: dict | None = None) -> dict:
    strategy = get_strategy(opts.strategy, **(strategy_options or {}))
    if getattr(strategy, "micro_batch_size", 0) is None:  # deepspeed's config wants the per-rank batch
        strategy.micro_batch_size = opts.batch_size
    torch.manual_seed(opts.seed)  # identical initial weights on every rank and every world size
    model, optimizer = strategy.setup(build_model(), OptimizerSpec(torch.optim.Adam, {"lr": opts.lr}), rt)
    loader = make_loader(train, opts, rt, opts.shuffle)
    loss_fn = nn.NLLLoss()
    steps_per_epoch = len(loader)
    step, start_epoch, skip = 0, 0, 0

    ckpt = Checkpointer(opts.checkpoint_dir, rt, strategy=strategy) if opts.checkpoint_dir else None
    if ckpt is not None:
        found = ckpt.latest()
        if found is not None:
            state = found.state
            strategy.load_state_dict(model, optimizer, state)
            step = int(state["step"])
            start_epoch, skip = resume_position(state, step, steps_per_epoch, rt.world_size, found.path)
            loader.load_state_dict({"epoch": start_epoch})
            set_rng_state(state["rng"])
            rebuild_buckets(model, lambda: loss_fn(model(train.images[:opts.batch_size].to(rt.device)),
                                                   train.labels[:opts.batch_size].to(rt.device)).backward())
            rt.print(f"Resumed from {found.path} at step {step} (epoch {start_epoch + 1}, batch {skip}); "
                     f"written with world size {state['trainscale']['world_size']}, now {rt.world_size}")

    def save() -> None:
        if ckpt is not None:
            ckpt.save(step, {**strategy.state_dict(model, optimizer), "step": step, "rng": rng_state(),
                             "epoch_steps": steps_per_epoch})

    preemption = rt.preemption  # from here on SIGUSR1 only sets a flag, checked at step boundaries
    preempted = False
    if rt.attempt:
        rt.print(f"Attempt {rt.attempt + 1} of this job (restarted or requeued {rt.attempt} time(s))")
    timer = StepTimer(rt, model, enabled=opts.breakdown)
    history: list[dict] = []
    total_steps = steps_per_epoch * opts.epochs if opts.max_steps is None else min(opts.max_steps,
                                                                                   steps_per_epoch * opts.epochs)
    rt.print(f"{name}: {len(train)} training samples, {rt.world_size} rank(s) x batch {opts.batch_size}, "
             f"{steps_per_epoch} steps/epoch, strategy {strategy.name}, device {rt.device}")
    for epoch in range(start_epoch, opts.epochs):
        if step >= total_steps:
            break
        t0 = time.perf_counter()
        loss_sum, seen = torch.zeros((), device=rt.device), 0
        batches = iter(loader)
        for _ in range(skip):
            next(batches)
        skip = 0
        timer.start_epoch()
        stop = False
        while step < total_steps:
            with timer.section("data"):
                batch = next(batches, None)
            if batch is None:
                break
            x, y = batch[0].to(rt.device, non_blocking=True), batch[1].to(rt.device, non_blocking=True)
            fault.maybe_inject(step)
            with rt.guard(step):
                with timer.section("compute"):
                    loss = loss_fn(model(x), y)
                    strategy.backward(loss, model)
                with timer.section("optimizer"):
                    strategy.step(optimizer, model)
            step += 1
            loss_sum += loss.detach()
            seen += 1
            if opts.log_every and step % opts.log_every == 0 and rt.is_main:
                done = (step - epoch * steps_per_epoch) / steps_per_epoch
                rt.print(f"Train Epoch: {epoch + 1} {progress_bar(done)} "
                         f"[{(step - epoch * steps_per_epoch) * opts.batch_size * rt.world_size}"
                         f"/{steps_per_epoch * opts.batch_size * rt.world_size} ({done:.0%})]\tLoss: {loss.item():.6f}")
            if ckpt is not None and opts.checkpoint_every and step % opts.checkpoint_every == 0:
                save()
            if preemption.requested():  # agreed across ranks: all stop at the same step
                stop = True
                break
        if stop:
            if not (opts.checkpoint_every and step % opts.checkpoint_every == 0):
                save()
            head = (f"Preempted ({preemption.received or 'signal on another rank'}) at step {step}, attempt "
                    f"{rt.attempt}: checkpoint saved" + (f" to {opts.checkpoint_dir}" if ckpt else " nowhere "
                    "(no --checkpoint-dir)"))
            preemption.requeue_and_log(head, rt.print)
            preempted = True
            break
        epoch_time = time.perf_counter() - t0
        train_loss = rt.mean(loss_sum / max(1, seen))
        epoch_time = rt.mean(epoch_time)
        test_loss, accuracy = evaluate(model, test, rt)
        samples = seen * opts.batch_size * rt.world_size
        record = {"epoch": epoch + 1, "steps": seen, "time_s": epoch_time, "samples_per_s": samples / epoch_time,
                  "train_loss": train_loss, "test_loss": test_loss, "accuracy": accuracy,
                  "breakdown": timer.summary()}
        history.append(record)
        rt.print(f"Epoch {epoch + 1}: loss {train_loss:.4f}, held-out loss {test_loss:.4f}, accuracy {accuracy:.2%}, "
                 f"time {epoch_time:.2f}s, {record['samples_per_s']:.0f} samples/s")
        if ckpt is not None and not opts.checkpoint_every:
            save()
    result = {"workload": name, "world_size": rt.world_size, "num_nodes": rt.num_nodes, "device": str(rt.device),
              "backend": rt.backend, "strategy": strategy.name, "options": asdict(opts), "steps": step,
              "epochs": history, "preempted": preempted, "attempt": rt.attempt, "train_time_s": sum(h["time_s"] for h in history)}
    if hasattr(strategy, "held_bytes"):  # per-rank memory table on rank 0 (a collective)
        result["memory"] = memory_report(rt, strategy.held_bytes(model, optimizer), strategy.name)
    if opts.metrics_out and rt.is_main:
        atomic_write_text(Path(opts.metrics_out), json.dumps(result, indent=2))
    result["model"] = strategy.unwrap(model)
    return result
