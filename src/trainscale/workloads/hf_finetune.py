"""Seeds 000/001: fine-tune a GPT-Neo-style causal LM with the Hugging Face Trainer, under trainscale.

    trainscale run --nproc-per-node 2 --workload hf-finetune --max-steps 40 --global-batch 16

Offline by default: a tiny GPT-Neo built from a config, byte-level tokens, and movie-review-like text
generated here. With a hub: ``--pretrained EleutherAI/gpt-neo-125M --hub-dataset imdb``.
The Trainer gets what the seeds set by hand: per-device batch = global batch / world size,
``ddp_backend`` by device (gloo on CPU, nccl on GPU), output printed once. Its logs (loss, learning rate,
gradient norm) go to the trackers chosen with ``--tracker`` through a callback calling ``rt.log``, the
same trackers and files as the other workloads (the Trainer's own ``report_to`` integrations stay off).
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

import trainscale
from trainscale.checkpoint import atomic_write_text
from trainscale.data import check_shardable
from trainscale.env import detect
from trainscale.errors import ConfigError
from trainscale.runtime.device import MIXED_BACKEND
from trainscale.strategies import parse_spec, process_group_backend
from trainscale.strategies.hf_trainer import prepare_environment, trainer_arguments
from trainscale.train import TrainOptions, parse
from trainscale.train.metrics import check_metrics_out, write_metrics
from trainscale.train.options import apply_threads, check_compile
from trainscale.workloads import text

MARKER = "trainscale-hf.json"
_SUBJECTS = ["The film", "This movie", "The sequel", "The director's new picture", "The documentary", "The remake"]
_GOOD = [
    "a moving, beautifully shot story",
    "sharp writing and a terrific cast",
    "the best thriller this year",
    "funny, warm and honest",
    "a score that stays with you",
]
_BAD = [
    "a dull, overlong mess",
    "wooden acting and a lazy script",
    "the worst comedy in years",
    "confusing and joyless",
    "a plot with more holes than cheese",
]


def review_corpus(n: int = 3000, seed: int = 0) -> list[str]:
    """IMDB-like sentences, labelled by their wording (deterministic, no download)."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        good = rng.random() < 0.5
        words = _GOOD if good else _BAD
        out.append(
            f"{rng.choice(_SUBJECTS)} is {rng.choice(words)}; {rng.choice(words)}. "
            f"Rating: {rng.randint(7, 10) if good else rng.randint(1, 4)}/10."
        )
    return out


class TokenBlocks(torch.utils.data.Dataset):
    """Token ids of the concatenated texts, cut into equal blocks (the run_clm recipe)."""

    def __init__(self, ids: torch.Tensor, block: int) -> None:
        n = ids.numel() // block
        if n < 1:
            raise ConfigError(
                f"the texts hold {ids.numel()} tokens, fewer than one block of {block}",
                hint="use a smaller --block-size",
            )
        self.blocks = ids[: n * block].view(n, block)

    def __len__(self) -> int:
        return self.blocks.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = self.blocks[i]
        return {"input_ids": ids, "labels": ids.clone(), "attention_mask": torch.ones_like(ids)}


@dataclass(frozen=True, kw_only=True)
class HFOptions:
    """hf-finetune's own options, beside the common ones (the same [train] table and TRAINSCALE_TRAIN_ variables)."""

    global_batch: int = 16
    """Samples per optimizer step over all ranks, split evenly over them."""
    block_size: int = 64
    """Tokens per training block."""
    output_dir: str = "runs/hf-finetune"
    """The Trainer's output_dir: checkpoints and logs."""
    pretrained: str | None = None
    """A hub model name (needs a network)."""
    hub_dataset: str | None = None
    """A hub dataset with a 'text' column, e.g. imdb."""


DEFAULTS = TrainOptions(epochs=1, lr=5e-4, log_every=10, loader="dataloader")  # the Trainer's own DataLoader


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What a run will do, checked before launch."""

    opts: TrainOptions
    """The common training options."""
    own: HFOptions
    """This workload's own options."""
    per_device: int
    """Per-rank batch: --global-batch / world size."""
    use_cpu: bool
    """True without GPUs (or with --device cpu): gloo instead of nccl."""
    strategy_args: dict = field(default_factory=dict)
    """TrainingArguments entries for --strategy (see hf_strategy)."""
    backend: str | None = None
    """The process group trainscale makes for the Trainer: gloo beside nccl for FSDP with CPU offload
    on GPUs (its gradient clipping reduces host-side shards), else the device's default."""


def plan(argv: list[str], world_size: int, *, gpus: bool | None = None) -> Plan:
    """Check ``argv`` for ``world_size`` ranks. ``gpus``: whether the ranks will see GPUs (a SLURM job
    planned on a login node knows it from the job's resources); ``None``: whether this machine has any."""
    opts, own = parse(
        argv, prog="trainscale run [launch options] --workload hf-finetune", defaults=DEFAULTS, workload=HFOptions
    )
    given = any(a == "--batch-size" or a.startswith("--batch-size=") for a in argv)
    if given or opts.batch_size != DEFAULTS.batch_size:  # also from a config file or the environment
        per_rank = max(1, own.global_batch // world_size)
        raise ConfigError(
            f"hf-finetune sizes its batch with --global-batch (split over the ranks), not "
            f"--batch-size (got --batch-size {opts.batch_size})",
            hint=f"e.g. --global-batch {per_rank * world_size}: {per_rank} per device on {world_size} rank(s)",
        )
    if own.global_batch < world_size or own.global_batch % world_size:
        raise ConfigError(
            f"--global-batch {own.global_batch} does not split evenly over {world_size} rank(s)",
            hint=f"use a multiple of {world_size}, e.g. --global-batch {world_size * 8}",
        )
    out = Path(own.output_dir)
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        raise ConfigError(
            f"{out} exists, is not empty and was not written by trainscale",
            hint="pick a new --output-dir; nothing in it was touched",
        )
    if opts.compile:
        check_compile()
    check_metrics_out(
        opts.metrics_out, resuming=(out / MARKER).exists() and any(out.glob("checkpoint-*")), checkpoints=out
    )
    per_device = own.global_batch // world_size
    use_cpu = opts.device == "cpu" or not (torch.cuda.is_available() if gpus is None else gpus)
    strategy_args = trainer_arguments(
        opts.strategy, world_size=world_size, per_device=per_device, use_cpu=use_cpu, accumulation=opts.grad_accum
    )
    return Plan(
        opts=opts,
        own=own,
        per_device=per_device,
        use_cpu=use_cpu,
        strategy_args=strategy_args,
        backend=None if use_cpu else process_group_backend(opts.strategy),
    )


def trainer_backend(backend: str | None) -> str | None:
    """``TrainingArguments.ddp_backend`` for trainscale's group: the Trainer accepts one name only, and
    it uses the group it finds; for the mixed group that name is its GPU side, nccl."""
    return "nccl" if backend == MIXED_BACKEND else backend


def tiny_config(vocab_size: int = 256, max_positions: int = 128):
    """A GPT-Neo small enough for CPU tests: 2 layers (one global, one local attention), hidden 64."""
    from transformers import GPTNeoConfig  # noqa: PLC0415 (optional dependency)

    return GPTNeoConfig(
        vocab_size=vocab_size,
        max_position_embeddings=max_positions,
        hidden_size=64,
        num_layers=2,
        num_heads=2,
        attention_types=[[["global", "local"], 1]],
        intermediate_size=256,
        window_size=32,
        bos_token_id=0,
        eos_token_id=0,
    )


def build_model(own: HFOptions):
    from transformers import GPTNeoForCausalLM  # noqa: PLC0415 (optional dependency)

    if own.pretrained:  # a hub name, or a local directory written by save_pretrained
        model = GPTNeoForCausalLM.from_pretrained(own.pretrained)
        if own.block_size > model.config.max_position_embeddings:
            raise ConfigError(
                f"--block-size {own.block_size} is longer than {own.pretrained}'s "
                f"{model.config.max_position_embeddings} positions",
                hint=f"use --block-size {model.config.max_position_embeddings} or less",
            )
        return model
    return GPTNeoForCausalLM(tiny_config(max_positions=max(128, own.block_size)))


def tokenize(own: HFOptions, corpus: list[str]) -> torch.Tensor:
    """Byte ids for the built-in tiny model; the pretrained model's own tokenizer with --pretrained
    (a hub name or a local directory saved with ``save_pretrained``)."""
    if not own.pretrained:
        return text.encode("\n".join(corpus))
    from transformers import AutoTokenizer  # noqa: PLC0415 (optional dependency)

    tokenizer = AutoTokenizer.from_pretrained(own.pretrained)
    end = [] if tokenizer.eos_token_id is None else [tokenizer.eos_token_id]
    ids = [i for encoded in tokenizer(corpus)["input_ids"] for i in encoded + end]
    return torch.tensor(ids, dtype=torch.int64)


def main(argv: list[str] | None = None) -> dict:
    env = detect()
    # The HF Trainer reads torchrun's variables; give srun/MPI tasks the same ones.
    if env.source in ("slurm", "mpi"):
        os.environ.update(
            {
                "RANK": str(env.rank),
                "LOCAL_RANK": str(env.local_rank),
                "WORLD_SIZE": str(env.world_size),
                "MASTER_ADDR": str(env.master_addr),
                "MASTER_PORT": str(env.master_port),
            }
        )
    run = plan(sys.argv[1:] if argv is None else argv, env.world_size)
    # trainscale makes the process group (device per local rank, store on the chosen address) and
    # tears it down with a final barrier; the Trainer (accelerate) finds it and uses it.
    with trainscale.init(
        **{**run.opts.runtime_options(), "device": "cpu" if run.use_cpu else run.opts.device, "backend": run.backend}
    ) as rt:
        return _train(rt, run)


def _train(rt, run: Plan) -> dict:
    opts, own, per_device = run.opts, run.own, run.per_device
    from transformers import Trainer, TrainingArguments, set_seed  # noqa: PLC0415 (optional dependency)
    from transformers.trainer_utils import get_last_checkpoint  # noqa: PLC0415 (optional dependency)

    set_seed(opts.seed)
    apply_threads(opts, rt)
    if rt.device.type == "cuda":
        accelerate_on_own_gpu(rt)
    for note in prepare_environment(run.strategy_args, rt):  # before TrainingArguments imports DeepSpeed
        rt.print(f"hf-finetune: {note}")
    out = Path(own.output_dir)
    resume = (out / MARKER).exists() and any(out.glob("checkpoint-*"))
    training_args = TrainingArguments(
        **{
            "output_dir": str(out),
            "per_device_train_batch_size": per_device,
            "learning_rate": opts.lr,
            "num_train_epochs": opts.epochs,
            "max_steps": opts.max_steps or -1,
            "logging_steps": max(1, opts.log_every or 10),
            "save_strategy": "steps" if opts.checkpoint_every else "no",
            "save_steps": opts.checkpoint_every or 500,
            "use_cpu": run.use_cpu,
            "ddp_backend": trainer_backend(rt.backend),
            "report_to": "none",
            "disable_tqdm": True,
            "seed": opts.seed,
            "dataloader_num_workers": opts.num_workers,
            "torch_compile": opts.compile,
            **run.strategy_args,
        }
    )
    with rt.rank_zero_first():  # rank 0 downloads and caches a hub dataset or model first
        dataset = TokenBlocks(
            tokenize(own, text.hub_texts(own.hub_dataset) if own.hub_dataset else review_corpus()), own.block_size
        )
        model = build_model(own)
    trainer = Trainer(model=model, args=training_args, train_dataset=dataset)
    accum = training_args.gradient_accumulation_steps
    strategy = parse_spec(opts.strategy)[0]
    if rt.is_main:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / MARKER, json.dumps({"workload": "hf-finetune", "world_size": rt.world_size}))
    if opts.trackers:  # in the output directory, once it is marked as this workload's
        rt.use_trackers(
            opts.trackers,
            directory=out,
            config={"workload": "hf-finetune", "world_size": rt.world_size, **{k: v for k, v in vars(opts).items()}},
        )
        trainer.add_callback(tracker_callback(rt))
    rt.print(
        f"hf-finetune: {rt.world_size} rank(s) x per-device batch {per_device}"
        f"{f' x accumulation {accum}' if accum > 1 else ''} = global batch {own.global_batch * accum}, "
        f"strategy {strategy}, backend {rt.backend}, {'CPU' if run.use_cpu else 'GPU'}"
    )
    last = get_last_checkpoint(str(out)) if resume else None
    if last is not None:
        rt.print(f"hf-finetune: resuming from {last}")
    started = time.perf_counter()
    output = trainer.train(resume_from_checkpoint=last)
    elapsed = time.perf_counter() - started
    # steps the Trainer took in this call (a resumed run starts past its checkpoint's step)
    steps = output.global_step - (int(Path(last).name.split("-")[-1]) if last else 0)
    samples = steps * own.global_batch * accum
    result = {
        "workload": "hf-finetune",
        "world_size": rt.world_size,
        "steps": output.global_step,
        "train_loss": output.training_loss,
        "train_time_s": elapsed,
        "per_device_batch": per_device,
        "strategy": opts.strategy,
        "model": type(trainer.model_wrapped).__name__,
        "blocks": len(dataset),
        "epochs": [
            {
                "epoch": 1,
                "time_s": elapsed,
                "train_loss": output.training_loss,
                "steps": steps,
                "samples": samples,
                "samples_per_s": samples / max(elapsed, 1e-9),
            }
        ],
    }
    rt.print(f"hf-finetune: {output.global_step} steps, train loss {output.training_loss:.4f}, {elapsed:.1f}s")
    write_metrics(opts.metrics_out, result, rt, checkpoints=own.output_dir)
    return result


def tracker_callback(rt):
    """A TrainerCallback handing each of the Trainer's log records to ``rt.log`` (rank 0 writes)."""
    from transformers import TrainerCallback  # noqa: PLC0415 (optional dependency)

    class ToTrackers(TrainerCallback):
        def on_log(self, args, state, control, logs=None, **kwargs):
            numbers = {
                f"train/{k}": v
                for k, v in (logs or {}).items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)
            }
            if numbers:
                rt.log(numbers, step=state.global_step)

    return ToTrackers()


def accelerate_on_own_gpu(rt) -> None:
    """accelerate takes the GPU from LOCAL_RANK: its device (given trainscale's instead), DDP's
    ``device_ids=[LOCAL_RANK]`` and ``wait_for_everyone``'s barrier on ``cuda:{LOCAL_RANK}`` (the Trainer
    calls it around saves and on resume). In a task that sees only its own GPU (srun mode: each task's
    visibility is narrowed to one device) local rank 1's ``cuda:1`` does not exist: "invalid device
    ordinal" on every task but the first of a node. There, DDP is left to take the device from the model
    (accelerate's ``ACCELERATE_BYPASS_DEVICE_MAP``: ``device_ids=None``, valid for a one-device module), and
    the barrier is trainscale's, on the rank's own device."""
    os.environ.setdefault("ACCELERATE_TORCH_DEVICE", str(rt.device))
    if rt.device.index == rt.local_rank:
        return
    os.environ["ACCELERATE_BYPASS_DEVICE_MAP"] = "true"
    from accelerate.state import PartialState  # noqa: PLC0415 (optional dependency)

    accelerates = PartialState.wait_for_everyone

    def wait_for_everyone(state) -> None:
        if state.use_distributed:
            rt.barrier()
        else:
            accelerates(state)

    PartialState.wait_for_everyone = wait_for_everyone


def preflight(argv: list[str], world_size: int, *, gpus: bool | None = None) -> None:
    try:
        import transformers  # noqa: F401, PLC0415 (optional dependency)
    except ImportError:
        raise ConfigError(
            "the hf-finetune workload needs transformers", hint="pip install transformers accelerate"
        ) from None
    run = plan(argv, world_size, gpus=gpus)
    if not (run.own.hub_dataset or run.own.pretrained):  # the built-in data is cheap to measure here
        blocks = len(TokenBlocks(tokenize(run.own, review_corpus()), run.own.block_size))
        check_shardable(
            blocks, world_size, run.per_device, what=f"built-in reviews ({run.own.block_size}-token blocks)"
        )


if __name__ == "__main__":
    main()
