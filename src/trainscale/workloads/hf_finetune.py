"""Seeds 000/001: fine-tune a GPT-Neo-style causal LM with the Hugging Face Trainer, under trainscale.

    trainscale run --nproc-per-node 2 --workload hf-finetune --max-steps 40 --global-batch 16

Offline by default: a tiny GPT-Neo built from a config, byte-level tokens, and movie-review-like text
generated here. With a hub: ``--pretrained EleutherAI/gpt-neo-125M --hub-dataset imdb``.
The Trainer gets what the seeds set by hand: per-device batch = global batch / world size,
``ddp_backend`` by device (gloo on CPU, nccl on GPU), output printed once.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

import torch

from trainscale.checkpoint import atomic_write_text
from trainscale.env import detect
from trainscale.errors import ConfigError
from trainscale.workloads.options import TrainOptions, parse

MARKER = "trainscale-hf.json"
_SUBJECTS = ["The film", "This movie", "The sequel", "The director's new picture", "The documentary", "The remake"]
_GOOD = ["a moving, beautifully shot story", "sharp writing and a terrific cast", "the best thriller this year",
         "funny, warm and honest", "a score that stays with you"]
_BAD = ["a dull, overlong mess", "wooden acting and a lazy script", "the worst comedy in years",
        "confusing and joyless", "a plot with more holes than cheese"]


def review_corpus(n: int = 3000, seed: int = 0) -> list[str]:
    """IMDB-like sentences, labelled by their wording (deterministic, no download)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        good = rng.random() < 0.5
        words = _GOOD if good else _BAD
        out.append(f"{rng.choice(_SUBJECTS)} is {rng.choice(words)}; {rng.choice(words)}. "
                   f"Rating: {rng.randint(7, 10) if good else rng.randint(1, 4)}/10.")
    return out


class ByteBlocks(torch.utils.data.Dataset):
    """Byte tokens of the concatenated texts, cut into equal blocks (the run_clm recipe)."""

    def __init__(self, texts: list[str], block: int) -> None:
        data = torch.frombuffer(bytearray("\n".join(texts).encode("utf-8")), dtype=torch.uint8).to(torch.int64)
        n = data.numel() // block
        if n < 1:
            raise ConfigError(f"the texts are shorter than one block of {block} tokens", hint="use a smaller --block-size")
        self.blocks = data[: n * block].view(n, block)

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.blocks[i]
        return {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}


def _extra(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--global-batch", type=int, default=16, help="split evenly over the ranks")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--output-dir", default="runs/hf-finetune")
    parser.add_argument("--pretrained", default=None, help="a hub model name (needs a network)")
    parser.add_argument("--hub-dataset", default=None, help="a hub dataset with a 'text' column, e.g. imdb")


DEFAULTS = TrainOptions(epochs=1, lr=5e-4, log_every=10)


def plan(argv: list[str], world_size: int):
    opts, args = parse(argv, prog="trainscale-workload hf-finetune", defaults=DEFAULTS, extra=_extra)
    if args.global_batch < world_size or args.global_batch % world_size:
        raise ConfigError(f"--global-batch {args.global_batch} does not split evenly over {world_size} rank(s)",
                          hint=f"use a multiple of {world_size}, e.g. --global-batch {world_size * 8}")
    out = Path(args.output_dir)
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        raise ConfigError(f"{out} exists, is not empty and was not written by trainscale",
                          hint="pick a new --output-dir; nothing in it was touched")
    return opts, args, args.global_batch // world_size


def build_model(args):
    from transformers import GPTNeoConfig, GPTNeoForCausalLM

    if args.pretrained:  # pragma: no cover - needs a hub
        return GPTNeoForCausalLM.from_pretrained(args.pretrained)
    config = GPTNeoConfig(vocab_size=256, max_position_embeddings=max(128, args.block_size), hidden_size=64,
                          num_layers=2, num_heads=2, attention_types=[[["global", "local"], 1]],
                          intermediate_size=256, window_size=32, bos_token_id=0, eos_token_id=0)
    return GPTNeoForCausalLM(config)


def texts(args) -> list[str]:
    if args.hub_dataset:  # pragma: no cover - needs a hub
        from datasets import load_dataset

        return list(load_dataset(args.hub_dataset, split="train")["text"][:20000])
    return review_corpus()


def main(argv: list[str] | None = None) -> dict:
    env = detect()
    # The HF Trainer reads torchrun's variables; give srun/MPI tasks the same ones.
    if env.source in ("slurm", "mpi"):
        os.environ.update({"RANK": str(env.rank), "LOCAL_RANK": str(env.local_rank), "WORLD_SIZE": str(env.world_size),
                           "MASTER_ADDR": str(env.master_addr), "MASTER_PORT": str(env.master_port)})
    opts, args, per_device = plan(sys.argv[1:] if argv is None else argv, env.world_size)
    from transformers import Trainer, TrainingArguments, set_seed

    set_seed(opts.seed)
    use_cpu = opts.device == "cpu" or not torch.cuda.is_available()
    out = Path(args.output_dir)
    resume = (out / MARKER).exists() and any(out.glob("checkpoint-*"))
    training_args = TrainingArguments(
        output_dir=str(out), per_device_train_batch_size=per_device, learning_rate=opts.lr,
        num_train_epochs=opts.epochs, max_steps=opts.max_steps or -1, logging_steps=max(1, opts.log_every or 10),
        save_strategy="steps" if opts.checkpoint_every else "no", save_steps=opts.checkpoint_every or 500,
        use_cpu=use_cpu, ddp_backend="gloo" if use_cpu else "nccl", report_to="none", disable_tqdm=True,
        seed=opts.seed, dataloader_num_workers=0, ddp_find_unused_parameters=False,
    )
    trainer = Trainer(model=build_model(args), args=training_args, train_dataset=ByteBlocks(texts(args), args.block_size))
    if trainer.is_world_process_zero():
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / MARKER, json.dumps({"workload": "hf-finetune", "world_size": env.world_size}))
        print(f"hf-finetune: {env.world_size} rank(s) x per-device batch {per_device} = global batch "
              f"{args.global_batch}, backend {training_args.ddp_backend}, {'CPU' if use_cpu else 'GPU'}", flush=True)
    started = time.perf_counter()
    output = trainer.train(resume_from_checkpoint=True if resume else None)
    elapsed = time.perf_counter() - started
    result = {"workload": "hf-finetune", "world_size": env.world_size, "steps": output.global_step,
              "train_loss": output.training_loss, "train_time_s": elapsed, "per_device_batch": per_device,
              "epochs": [{"epoch": 1, "time_s": elapsed, "train_loss": output.training_loss,
                          "samples_per_s": output.global_step * args.global_batch / max(elapsed, 1e-9)}]}
    if trainer.is_world_process_zero():
        print(f"hf-finetune: {output.global_step} steps, train loss {output.training_loss:.4f}, {elapsed:.1f}s", flush=True)
        if opts.metrics_out:
            atomic_write_text(Path(opts.metrics_out), json.dumps(result, indent=2))
    return result


def preflight(argv: list[str], world_size: int) -> None:
    try:
        import transformers  # noqa: F401
    except ImportError:
        raise ConfigError("the hf-finetune workload needs transformers", hint="pip install 'trainscale[lm]'") from None
    plan(argv, world_size)


if __name__ == "__main__":
    main()
