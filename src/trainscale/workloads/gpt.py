"""Seed 003's LLM training loop, with its habits done by trainscale: a GPT-2-style causal LM.

    trainscale run --nproc-per-node 2 --workload gpt --max-steps 200 --experiment-dir runs/gpt-demo

- data tokenized on rank 0 first, the others wait and read the cache;
- the experiment directory made on rank 0 between barriers; an existing one is resumed, a foreign
  non-empty one refused (never clobbered);
- checkpoints of model, optimizer, LR scheduler, step and RNG, plus a human-readable state.json;
- per-rank metric streams under one experiment (TensorBoard event files per rank; wandb offline if installed);
- gradient accumulation without an all-reduce on the accumulating micro-steps.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import uuid
from dataclasses import asdict
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import trainscale
from trainscale.checkpoint import Checkpointer, atomic_write_text
from trainscale.data import DeviceTensorLoader, check_shardable
from trainscale.errors import ConfigError
from trainscale.runtime.memory import report as memory_report
from trainscale.runtime.seed import rng_state, set_rng_state
from trainscale.strategies import check_strategy, get_strategy, process_group_backend
from trainscale.strategies.base import OptimizerSpec
from trainscale.strategies.ddp import rebuild_buckets
from trainscale.workloads import fault, text
from trainscale.workloads.options import TrainOptions, parse, planned_device
from trainscale.workloads.streams import MetricStreams

MARKER = "experiment.json"


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, *, vocab: int = text.VOCAB, seq_len: int = 128, width: int = 128, depth: int = 4,
                 heads: int = 4) -> None:
        super().__init__()
        if width % heads:
            raise ConfigError(f"--n-embd {width} is not divisible by --n-head {heads}", hint="e.g. --n-embd 128 --n-head 4")
        self.tok = nn.Embedding(vocab, width)
        self.pos = nn.Embedding(seq_len, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(depth))
        self.ln = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def _extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--n-layer", type=int, default=4)
    parser.add_argument("--n-embd", type=int, default=128)
    parser.add_argument("--n-head", type=int, default=4)
    parser.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    parser.add_argument("--warmup", type=int, default=20, help="LR warm-up steps (then cosine decay)")
    parser.add_argument("--experiment-dir", default="runs/gpt")
    parser.add_argument("--hub-dataset", default=None, help="a HF dataset name instead of the built-in corpus")
    parser.add_argument("--tokenizer", default=None,
                        help="a HF tokenizer (hub name or save_pretrained directory) instead of bytes")


DEFAULTS = TrainOptions(epochs=1, batch_size=8, lr=3e-4, log_every=20)


def _parse(argv: list[str]):
    opts, args = parse(argv, prog="trainscale-workload gpt", defaults=DEFAULTS, extra=_extra)
    if args.grad_accum < 1:
        raise ConfigError(f"--grad-accum {args.grad_accum} must be >= 1", hint="e.g. --grad-accum 4")
    if args.seq_len < 2:
        raise ConfigError(f"--seq-len {args.seq_len} must be >= 2", hint="e.g. --seq-len 128")
    return opts, args


def open_experiment(rt, directory: Path, tokenizer: str | None = None) -> tuple[bool, dict]:
    """Seed 003's pattern: every rank checks, rank 0 creates, everybody waits. Returns (resuming, the
    experiment's record: a random id for its metric streams, the tokenizer its checkpoints were trained with)."""
    marker = directory / MARKER
    exists = marker.exists()
    foreign = directory.exists() and not exists and any(directory.iterdir())
    rt.barrier()  # all ranks have looked before anything is created
    if foreign:
        raise ConfigError(f"{directory} exists, is not empty and is not a trainscale experiment",
                          hint="pick a new --experiment-dir; nothing in it was touched")
    if exists:
        check_resumable(directory, tokenizer)
    elif rt.is_main:
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(marker, json.dumps({"workload": "gpt", "created": time.time(),
                                              "id": uuid.uuid4().hex[:12], "tokenizer": tokenizer}))
    rt.barrier()
    return exists, json.loads(marker.read_text())


def check_resumable(directory: Path, tokenizer: str | None) -> None:
    """An experiment resumes only with the tokenizer it was trained with (another vocabulary would not
    fit its checkpoints' embedding)."""
    record = json.loads((directory / MARKER).read_text())
    if "tokenizer" in record and record["tokenizer"] != tokenizer:
        def name(t):
            return f"--tokenizer {t}" if t else "the byte tokenizer (no --tokenizer)"
        raise ConfigError(f"experiment {directory} was trained with {name(record['tokenizer'])}, "
                          f"this run asks for {name(tokenizer)}",
                          hint=f"resume with {name(record['tokenizer'])}, or pick a new --experiment-dir")


def lr_lambda(warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))
    return factor


def torch_optimizer(optimizer) -> torch.optim.Optimizer | None:
    """The torch optimizer whose param_groups carry the LR: the optimizer itself, or the one a
    DeepSpeed ZeRO optimizer steps on its flat partitions."""
    for candidate in (optimizer, getattr(optimizer, "optimizer", None)):
        if isinstance(candidate, torch.optim.Optimizer):
            return candidate
    return None


def main(argv: list[str] | None = None) -> dict:
    opts, args = _parse(sys.argv[1:] if argv is None else argv)
    exp = Path(args.experiment_dir)
    with trainscale.init(device=opts.device, backend=process_group_backend(opts.strategy), seed=opts.seed,
                         timeout_s=opts.timeout_s) as rt:
        resuming, record = open_experiment(rt, exp, args.tokenizer)
        with rt.rank_zero_first():  # tokenize once; the others read the cache
            cache = text.prepare(exp / "data", args.hub_dataset or "builtin", tokenizer=args.tokenizer)
        tokens = text.load(cache)
        train = text.windows(tokens["train"], args.seq_len)
        val = text.windows(tokens["val"], args.seq_len)
        loader = DeviceTensorLoader.for_runtime(train, runtime=rt, batch_size=opts.batch_size, shuffle=opts.shuffle)

        options = {"gradient_accumulation_steps": args.grad_accum} if opts.strategy.startswith("deepspeed") else {}
        if opts.strategy.split(":")[0] == "fsdp" and "unit_modules" not in opts.strategy:
            options["unit_modules"] = ("Block",)
        strategy = get_strategy(opts.strategy, **options)
        if hasattr(strategy, "micro_batch_size") and strategy.micro_batch_size is None:
            strategy.micro_batch_size = opts.batch_size
        torch.manual_seed(opts.seed)
        model, optimizer = strategy.setup(
            GPT(vocab=tokens["vocab"], seq_len=args.seq_len, width=args.n_embd, depth=args.n_layer, heads=args.n_head),
            OptimizerSpec(torch.optim.AdamW, {"lr": opts.lr, "weight_decay": 0.1}), rt)
        steps_per_epoch = len(loader) // args.grad_accum
        total = steps_per_epoch * opts.epochs if opts.max_steps is None else opts.max_steps
        if steps_per_epoch < 1:
            raise ConfigError(f"one epoch has {len(loader)} micro-batches, fewer than --grad-accum {args.grad_accum}",
                              hint="lower --grad-accum or --batch-size")
        inner = torch_optimizer(optimizer)
        scheduler = torch.optim.lr_scheduler.LambdaLR(inner, lr_lambda(args.warmup, total)) if inner else None
        ckpt = Checkpointer(opts.checkpoint_dir or exp / "checkpoints", rt, strategy=strategy)
        step = 0
        found = ckpt.latest() if resuming or opts.checkpoint_dir else None
        if found is not None:
            strategy.load_state_dict(model, optimizer, found.state)
            if scheduler is not None and "scheduler" in found.state:
                scheduler.load_state_dict(found.state["scheduler"])
            step = int(found.state["step"])
            set_rng_state(found.state["rng"])

            def warm_up() -> None:  # one discarded forward/backward: DDP lays out its buckets as before
                window = train[:opts.batch_size].to(rt.device)
                logits = model(window[:, :-1])
                F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1)).backward()

            rebuild_buckets(model, warm_up)
            rt.print(f"Resumed experiment {exp} at step {step} from {found.path}")
        loader.load_state_dict({"epoch": step // steps_per_epoch})
        writer = MetricStreams(exp, rt.rank, exp.resolve().name, run_id=record.get("id"))

        def current_lr() -> float:
            return float(inner.param_groups[0]["lr"]) if inner is not None else opts.lr

        def save() -> None:
            state = {**strategy.state_dict(model, optimizer), "step": step, "rng": rng_state()}
            if scheduler is not None:
                state["scheduler"] = scheduler.state_dict()
            ckpt.save(step, state)
            if rt.is_main:  # the seed's state.json, written atomically
                atomic_write_text(exp / "state.json", json.dumps({"step": step, "epoch": step / steps_per_epoch,
                                                                  "loss": last_loss, "lr": current_lr(),
                                                                  "time": time.time()}))

        # ZeRO-3 leaves empty placeholders in the module; ds_numel is the full size.
        n_params = sum(getattr(p, "ds_numel", p.numel()) for p in strategy.unwrap(model).parameters())
        rt.print(f"gpt: {n_params:,} parameters, "
                 f"{train.shape[0]} windows of {args.seq_len} tokens, {rt.world_size} rank(s) x batch "
                 f"{opts.batch_size} x accumulation {args.grad_accum}, strategy {strategy.name}")
        preemption = rt.preemption
        last_loss, history, started = float("nan"), [], time.perf_counter()
        skip = (step % steps_per_epoch) * args.grad_accum
        batches = iter(loader)
        for _ in range(skip):
            next(batches)
        while step < total:
            fault.maybe_inject(step)
            micro_losses = []
            for micro in range(args.grad_accum):
                batch = next(batches, None)
                if batch is None:  # next epoch: the loader reshuffles by itself
                    batches = iter(loader)
                    batch = next(batches)
                window = batch[0]
                x, y = window[:, :-1], window[:, 1:]
                last_micro = micro == args.grad_accum - 1
                # No all-reduce on accumulating micro-steps; DeepSpeed accumulates by itself.
                sync = last_micro or strategy.name == "deepspeed"
                with rt.guard(step), (strategy.no_sync(model) if not sync else _null()):
                    logits = model(x)
                    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)) / args.grad_accum
                    strategy.backward(loss, model)
                    if strategy.name == "deepspeed":
                        strategy.step(optimizer, model)
                micro_losses.append(float(loss.detach()) * args.grad_accum)
            if strategy.name != "deepspeed":
                strategy.step(optimizer, model)
            if scheduler is not None:
                scheduler.step()
            step += 1
            last_loss = sum(micro_losses) / len(micro_losses)
            writer.add_scalar("train/loss", last_loss, step)
            if opts.log_every and step % opts.log_every == 0:
                rt.print(f"step {step}/{total}: loss {rt.mean(last_loss):.4f}")
            if opts.checkpoint_every and step % opts.checkpoint_every == 0:
                save()
            if preemption.requested():
                save()
                preemption.requeue_and_log(f"Preempted at step {step}: checkpoint saved", rt.print)
                break
        elapsed = rt.mean(time.perf_counter() - started)
        val_loss = evaluate(model, val, rt, opts.batch_size)
        writer.add_scalar("val/loss", val_loss, step)
        writer.close()
        if not opts.checkpoint_every or step % opts.checkpoint_every:
            save()
        tokens_per_s = step * args.grad_accum * opts.batch_size * args.seq_len * rt.world_size / max(elapsed, 1e-9)
        history.append({"epoch": step / steps_per_epoch, "steps": step, "time_s": elapsed, "train_loss": rt.mean(last_loss),
                        "test_loss": val_loss, "tokens_per_s": tokens_per_s, "lr": current_lr(),
                        "samples_per_s": tokens_per_s / args.seq_len})
        rt.print(f"gpt: {step} steps, train loss {history[-1]['train_loss']:.4f}, validation loss {val_loss:.4f}, "
                 f"{tokens_per_s:,.0f} tokens/s")
        result = {"workload": "gpt", "world_size": rt.world_size, "num_nodes": rt.num_nodes, "device": str(rt.device),
                  "strategy": strategy.name, "options": asdict(opts), "steps": step, "epochs": history,
                  "vocab": tokens["vocab"], "train_windows": int(train.shape[0]),
                  "train_time_s": elapsed, "experiment_dir": str(exp)}
        result["memory"] = memory_report(rt, strategy.held_bytes(model, optimizer), strategy.name)
        if opts.metrics_out and rt.is_main:
            atomic_write_text(Path(opts.metrics_out), json.dumps(result, indent=2, default=str))
        return result


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


@torch.no_grad()
def evaluate(model: nn.Module, val: torch.Tensor, rt, batch_size: int) -> float:
    model.eval()
    mine = val[rt.rank::rt.world_size][: 32 * batch_size].to(rt.device)
    total, count = 0.0, 0
    for i in range(0, mine.shape[0], batch_size):
        window = mine[i:i + batch_size]
        logits = model(window[:, :-1])
        total += float(F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1), reduction="sum"))
        count += window[:, 1:].numel()
    model.train()
    return rt.sum(total) / max(1.0, rt.sum(float(count)))


def preflight(argv: list[str], world_size: int, *, gpus: bool | None = None) -> None:
    opts, args = _parse(argv)
    GPT(seq_len=args.seq_len, width=args.n_embd, depth=1, heads=args.n_head)
    check_strategy(opts.strategy, world_size, batch_size=opts.batch_size,
                   device=planned_device(opts.device, gpus))
    exp = Path(args.experiment_dir)
    if exp.exists() and not (exp / MARKER).exists() and any(exp.iterdir()):
        raise ConfigError(f"{exp} exists, is not empty and is not a trainscale experiment",
                          hint="pick a new --experiment-dir; nothing in it was touched")
    if (exp / MARKER).exists():
        check_resumable(exp, args.tokenizer)
    if not (args.hub_dataset or args.tokenizer):  # the built-in corpus in bytes is cheap to measure here
        n_windows = (len(text.encode(text.builtin_corpus())) * 9 // 10 - 1) // args.seq_len
        check_shardable(n_windows, world_size, opts.batch_size, what="built-in corpus (windows)")


if __name__ == "__main__":
    main()
