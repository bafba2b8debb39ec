"""Seed 003's LLM training, with its habits done by trainscale: a GPT-2-style causal LM.

    trainscale run --nproc-per-node 2 --workload gpt --max-steps 200 --experiment-dir runs/gpt-demo

- data tokenized on rank 0 first, the others wait and read the cache;
- the experiment directory made on rank 0 between barriers; an existing one is resumed, a foreign
  non-empty one refused (never clobbered);
- checkpoints of model, optimizer, LR scheduler, step and RNG, plus a human-readable state.json;
- the training curves in the experiment directory, to the trackers chosen with ``--tracker`` (TensorBoard,
  W&B offline, MLflow's local store, CSV), one run per experiment that a resumed run continues;
- gradient accumulation without an all-reduce on the accumulating micro-steps (the training loop's).
"""

from __future__ import annotations

import json
import math
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

import trainscale
from trainscale.checkpoint import atomic_write_text
from trainscale.data import DeviceTensorLoader
from trainscale.errors import ConfigError
from trainscale.strategies.base import OptimizerSpec
from trainscale.train import Loop, Task, TrainOptions, parse
from trainscale.train.options import apply_threads, check_training
from trainscale.workloads import text

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


def check_heads(width: int, heads: int) -> None:
    if width % heads:
        raise ConfigError(f"--n-embd {width} is not divisible by --n-head {heads}", hint="e.g. --n-embd 128 --n-head 4")


class GPT(nn.Module):
    _no_split_modules = ("Block",)  # FSDP shards per transformer block (and the rest as the root)

    def __init__(
        self, *, vocab: int = text.VOCAB, seq_len: int = 128, width: int = 128, depth: int = 4, heads: int = 4
    ) -> None:
        super().__init__()
        check_heads(width, heads)
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


@dataclass(frozen=True, kw_only=True)
class GPTOptions:
    """gpt's own options, beside the common ones (the same [train] table and TRAINSCALE_TRAIN_ variables)."""

    seq_len: int = 128
    """Tokens per training window."""
    n_layer: int = 4
    """Transformer blocks."""
    n_embd: int = 128
    """Embedding width."""
    n_head: int = 4
    """Attention heads; must divide --n-embd."""
    warmup: int = 20
    """LR warm-up steps, then cosine decay."""
    experiment_dir: str = "runs/gpt"
    """Data cache, checkpoints, state.json and the --tracker files; an existing experiment is resumed."""
    hub_dataset: str | None = None
    """A HF dataset name instead of the built-in corpus."""
    tokenizer: str | None = None
    """A HF tokenizer (hub name or save_pretrained directory) instead of bytes."""

    def __post_init__(self) -> None:
        if self.seq_len < 2:
            raise ConfigError(f"--seq-len {self.seq_len} must be >= 2", hint="e.g. --seq-len 128")
        check_heads(self.n_embd, self.n_head)
        given = Path(self.experiment_dir)
        for place in (given, *given.absolute().parents):
            if place.exists() and not place.is_dir():  # refused before launch, not as a traceback on every rank
                raise ConfigError(
                    f"--experiment-dir {self.experiment_dir}: {place} is a file, not a directory",
                    hint="give a directory (it is created if missing), e.g. --experiment-dir runs/gpt",
                )


DEFAULTS = TrainOptions(epochs=1, batch_size=8, lr=3e-4)


def _parse(argv: list[str]) -> tuple[TrainOptions, GPTOptions]:
    return parse(argv, prog="trainscale run [launch options] --workload gpt", defaults=DEFAULTS, workload=GPTOptions)


def open_experiment(rt, directory: Path, tokenizer: str | None = None) -> tuple[bool, dict]:
    """Seed 003's pattern: every rank checks, rank 0 creates, everybody waits. Returns (resuming, the
    experiment's record: a random id for its trackers' run, the tokenizer its checkpoints were trained with)."""
    marker = directory / MARKER
    exists = marker.exists()
    foreign = directory.exists() and not exists and any(directory.iterdir())
    rt.barrier()  # all ranks have looked before anything is created
    if foreign:
        raise ConfigError(
            f"{directory} exists, is not empty and is not a trainscale experiment",
            hint="pick a new --experiment-dir; nothing in it was touched",
        )
    if exists:
        check_resumable(directory, tokenizer)
    elif rt.is_main:
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(
            marker,
            json.dumps(
                {"workload": "gpt", "created": time.time(), "id": uuid.uuid4().hex[:12], "tokenizer": tokenizer}
            ),
        )
    rt.barrier()
    return exists, json.loads(marker.read_text())


def check_resumable(directory: Path, tokenizer: str | None) -> None:
    """An experiment resumes only with the tokenizer it was trained with (another vocabulary would not
    fit its checkpoints' embedding)."""
    record = json.loads((directory / MARKER).read_text())
    if "tokenizer" in record and record["tokenizer"] != tokenizer:

        def name(t):
            return f"--tokenizer {t}" if t else "the byte tokenizer (no --tokenizer)"

        raise ConfigError(
            f"experiment {directory} was trained with {name(record['tokenizer'])}, this run asks for {name(tokenizer)}",
            hint=f"resume with {name(record['tokenizer'])}, or pick a new --experiment-dir",
        )


def lr_lambda(warmup: int, total: int):
    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    return factor


def lm_loss(model: nn.Module, batch: tuple[torch.Tensor], reduction: str = "mean") -> torch.Tensor:
    """Next-token cross entropy over a batch of (seq_len + 1)-token windows."""
    window = batch[0]
    logits = model(window[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1), reduction=reduction)


def main(argv: list[str] | None = None) -> dict:
    opts, gpt = _parse(sys.argv[1:] if argv is None else argv)
    exp = Path(gpt.experiment_dir)
    with trainscale.init(**opts.runtime_options()) as rt:
        apply_threads(opts, rt)
        resuming, record = open_experiment(rt, exp, gpt.tokenizer)
        if resuming:
            rt.print(f"Resumed experiment {exp}")
        with rt.rank_zero_first():  # tokenize once; the others read the cache
            cache = text.prepare(exp / "data", gpt.hub_dataset or "builtin", tokenizer=gpt.tokenizer)
        tokens = text.load(cache)
        train = text.windows(tokens["train"], gpt.seq_len)
        val = text.windows(tokens["val"], gpt.seq_len)
        task = Task(
            name="gpt",
            loss=lm_loss,
            samples=int(train.shape[0]),
            past_epochs=True,
            tokens_per_sample=gpt.seq_len,
            model=lambda: GPT(
                vocab=tokens["vocab"], seq_len=gpt.seq_len, width=gpt.n_embd, depth=gpt.n_layer, heads=gpt.n_head
            ),
            optimizer=OptimizerSpec(torch.optim.AdamW, {"lr": opts.lr, "weight_decay": 0.1}),
            loader=DeviceTensorLoader.for_runtime(train, runtime=rt, batch_size=opts.batch_size, shuffle=opts.shuffle),
            evaluate=lambda model: {"test_loss": evaluate(model, val, rt, opts.batch_size)},
            scheduler=lambda optimizer, total: torch.optim.lr_scheduler.LambdaLR(
                optimizer, lr_lambda(gpt.warmup, total)
            ),
            extra={"vocab": tokens["vocab"], "train_windows": int(train.shape[0]), "experiment_dir": str(exp)},
        )
        loop = Loop(
            rt,
            opts,
            task,
            checkpoint_dir=opts.checkpoint_dir or exp / "checkpoints",
            resume=resuming or bool(opts.checkpoint_dir),
            state_file=exp / "state.json",
            tracker_dir=exp,
            tracker_id=record.get("id"),
        )
        return loop.run()


@torch.no_grad()
def evaluate(model: nn.Module, val: torch.Tensor, rt, batch_size: int) -> float:
    model.eval()
    mine = val[rt.rank :: rt.world_size][: 32 * batch_size].to(rt.device)
    total, count = 0.0, 0
    for i in range(0, mine.shape[0], batch_size):
        window = mine[i : i + batch_size]
        total += float(lm_loss(model, (window,), reduction="sum"))
        count += window[:, 1:].numel()
    model.train()
    return rt.sum(total) / max(1.0, rt.sum(float(count)))


def preflight(argv: list[str], world_size: int, *, gpus: bool | None = None) -> None:
    opts, gpt = _parse(argv)
    GPT(seq_len=gpt.seq_len, width=gpt.n_embd, depth=1, heads=gpt.n_head)
    builtin = not (gpt.hub_dataset or gpt.tokenizer)  # the built-in corpus in bytes is cheap to measure here
    exp = Path(gpt.experiment_dir)
    check_training(
        opts,
        world_size,
        gpus=gpus,
        what="built-in corpus (windows)",
        samples=(len(text.encode(text.builtin_corpus())) * 9 // 10 - 1) // gpt.seq_len if builtin else None,
        checkpoint_dir=opts.checkpoint_dir or exp / "checkpoints",
    )
    if exp.exists() and not (exp / MARKER).exists() and any(exp.iterdir()):
        raise ConfigError(
            f"{exp} exists, is not empty and is not a trainscale experiment",
            hint="pick a new --experiment-dir; nothing in it was touched",
        )
    if (exp / MARKER).exists():
        check_resumable(exp, gpt.tokenizer)


if __name__ == "__main__":
    main()
