"""Options of the training loop that every built-in workload accepts, parsed into a validated dataclass and
resolved in the one documented order (defaults < config file < environment < command line); a workload's own
options (its own frozen dataclass) resolve beside them, from the same [train] table and variables."""

from __future__ import annotations

import argparse
import dataclasses
import os
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, TypeVar

from trainscale.config import field_docs, load_config_file, resolve_group
from trainscale.config.argparsing import Parser, unrecognized
from trainscale.errors import ConfigError
from trainscale.launch.torchrun import parser as launch_parser

W = TypeVar("W")


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """The common knobs of a built-in workload."""

    epochs: int = 5
    """Passes over the training data (ignored once --max-steps is reached)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps."""
    batch_size: int = 16
    """Samples per rank per micro-batch."""
    grad_accum: int = 1
    """Micro-batches per optimizer step (gradients synchronised on the last one only)."""
    lr: float = 1e-3
    """Learning rate."""
    seed: int = 0
    """Seed for model initialisation and shuffling (same on every rank)."""
    strategy: str = "ddp"
    """ddp, zero1, fsdp or deepspeed, with options as NAME:KEY=VALUE,... (docs/strategies.md)."""
    device: str = "auto"
    """auto (GPU when visible), cpu or cuda."""
    data: str = "digits"
    """Data source; each workload lists its own."""
    data_dir: str | None = None
    """Where real data lives (or is downloaded to)."""
    samples: int = 60000
    """Training samples for synthetic data."""
    loader: str = "tensor"
    """tensor (whole set on the device, index batches) or dataloader (DataLoader + DistributedSampler)."""
    shuffle: bool = True
    """Shuffle every epoch (seeded, identical across world sizes)."""
    checkpoint_dir: str | None = None
    """Save checkpoints here and resume from the newest one (gpt: <experiment dir>/checkpoints by default)."""
    fresh: bool = False
    """Start from step 0 where checkpoints exist: the checkpoint directory is moved aside to
    <dir>.before-<date> (nothing is deleted) instead of resumed."""
    checkpoint_every: int = 0
    """Save every N optimizer steps (0: at the end of every epoch only)."""
    checkpoint_async: bool | None = None
    """Save checkpoints in the background, training waiting only while the state is copied to host memory
    (None: wherever that is safe, i.e. not where a strategy's engine writes its own files, as DeepSpeed's)."""
    metrics_out: str | None = None
    """Write per-epoch metrics as JSON here (rank 0)."""
    trackers: tuple[str, ...] = ()
    """Experiment trackers for the training curves, a comma list of tensorboard, wandb, mlflow, csv: written by
    rank 0 in the run directory (gpt: the experiment directory, hf-finetune: --output-dir), offline."""
    timeout_s: float = 1800.0
    """Collective timeout in seconds: a rank that stops participating becomes an error after this."""
    log_every: int | None = None
    """A progress line (rate, ETA) on rank 0 every N optimizer steps (0: never); default every 30 s."""
    breakdown: bool = False
    """At the end, rank 0's steady step split into data, forward, backward, exposed communication, optimizer
    and other, from its step records (they are always recorded; ``trainscale report`` shows every rank's)."""
    download: bool = False
    """Download real data when missing (rank 0 first; needs a network)."""
    deterministic: bool = False
    """Deterministic algorithms: bitwise-repeatable GPU runs and resumes, somewhat slower (docs/gpu.md)."""
    compile: bool = False
    """torch.compile the model once the strategy has wrapped it (needs a C++ compiler; first steps compile)."""
    num_workers: int = 0
    """DataLoader worker processes per rank (--loader dataloader only); 0: load in the training process."""
    threads: int | None = None
    """CPU threads per rank (torch.set_num_threads); None: keep OMP_NUM_THREADS as the launch set it."""

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ConfigError(f"--epochs {self.epochs} must be >= 1", hint="e.g. --epochs 5")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"--max-steps {self.max_steps} must be >= 1", hint="leave it out to run whole epochs")
        if self.batch_size < 1:
            raise ConfigError(
                f"--batch-size {self.batch_size} must be >= 1", hint="the batch size is per rank, e.g. --batch-size 16"
            )
        if self.grad_accum < 1:
            raise ConfigError(f"--grad-accum {self.grad_accum} must be >= 1", hint="e.g. --grad-accum 4")
        if not self.lr > 0:
            raise ConfigError(f"--lr {self.lr} must be > 0", hint="e.g. --lr 0.001")
        if self.loader not in ("tensor", "dataloader"):
            raise ConfigError(f"--loader {self.loader!r} unknown", hint="use tensor or dataloader")
        if self.checkpoint_every < 0:
            raise ConfigError(f"--checkpoint-every {self.checkpoint_every} is negative", hint="use 0 or more steps")
        if self.samples < 1:
            raise ConfigError(f"--samples {self.samples} must be >= 1", hint="e.g. --samples 60000")
        if not 0 < self.timeout_s < 2**31 / 1000:  # nan and inf fail this too; torch keeps it in int32 milliseconds
            raise ConfigError(
                f"--timeout {self.timeout_s} must be a number of seconds > 0 and below 2147483",
                hint="seconds, e.g. --timeout 600",
            )
        if not 0 <= self.seed < 2**63:
            raise ConfigError(
                f"--seed {self.seed} is outside 0 ... 2**63 - 1 (torch's seeds are 64-bit)", hint="e.g. --seed 0"
            )
        if self.num_workers < 0:
            raise ConfigError(f"--num-workers {self.num_workers} is negative", hint="0 (load in the rank) or more")
        if self.num_workers and self.loader != "dataloader":
            raise ConfigError(
                f"--num-workers {self.num_workers} with --loader {self.loader}: the tensor loader "
                "slices batches from memory already on the device and has no worker processes",
                hint="add --loader dataloader, or leave --num-workers out",
            )
        if self.threads is not None and self.threads < 1:
            raise ConfigError(
                f"--threads {self.threads} must be >= 1",
                hint="CPU threads per rank, e.g. --threads 1; leave it out to keep OMP_NUM_THREADS",
            )
        from trainscale.train.trackers import parse_trackers  # noqa: PLC0415 (torch-free module)

        object.__setattr__(self, "trackers", parse_trackers(self.trackers))  # a config file may give "csv,wandb"
        if self.checkpoint_async:  # refused where it cannot be done, before anything is launched
            from trainscale.strategies import get_strategy  # noqa: PLC0415 (torch-free module)

            strategy = get_strategy(self.strategy)
            strategy.storage.resolve_async(True, strategy.name)

    def runtime_options(self) -> dict[str, Any]:
        """``trainscale.init``'s arguments for these options: device, seed, collective timeout, determinism,
        and the process group the strategy needs (gloo beside nccl for FSDP's CPU offload)."""
        from trainscale.strategies import process_group_backend  # noqa: PLC0415 (torch-free module)

        return {
            "device": self.device,
            "backend": process_group_backend(self.strategy),
            "seed": self.seed,
            "deterministic": self.deterministic,
            "timeout_s": self.timeout_s,
        }


def add_common_arguments(parser: argparse.ArgumentParser, defaults: TrainOptions | None = None) -> None:
    """The common options, each described by its TrainOptions field's docstring (with the workload's
    default). Defaults are applied by :func:`parse` (so a config file or the environment can sit
    between them and the command line); here every option defaults to "not given"."""
    docs, d = field_docs(TrainOptions), argparse.SUPPRESS
    defaults = defaults or TrainOptions()

    def add(flag: str, name: str, **kwargs: Any) -> None:
        value = getattr(defaults, name)
        shown = "" if value is None or isinstance(value, bool) or value == () else f" (default: {value})"
        parser.add_argument(flag, dest=name, default=d, help=(docs[name] + shown).replace("%", "%%"), **kwargs)

    parser.add_argument(
        "--config", default=None, help="TOML file with a [train] table of these options (docs/architecture.md)"
    )
    for flag, name, kwargs in (
        ("--epochs", "epochs", {"type": int}),
        ("--max-steps", "max_steps", {"type": int}),
        ("--batch-size", "batch_size", {"type": int}),
        ("--grad-accum", "grad_accum", {"type": int}),
        ("--lr", "lr", {"type": float}),
        ("--seed", "seed", {"type": int}),
        ("--strategy", "strategy", {}),
        ("--device", "device", {}),
        ("--data", "data", {}),
        ("--data-dir", "data_dir", {}),
        ("--samples", "samples", {"type": int}),
        ("--loader", "loader", {"choices": ("tensor", "dataloader")}),
        ("--checkpoint-dir", "checkpoint_dir", {}),
        ("--fresh", "fresh", {"action": "store_true"}),
        ("--checkpoint-every", "checkpoint_every", {"type": int}),
        ("--checkpoint-async", "checkpoint_async", {"action": argparse.BooleanOptionalAction}),
        ("--metrics-out", "metrics_out", {}),
        ("--timeout", "timeout_s", {"type": float}),
        ("--tracker", "trackers", {"metavar": "NAME[,NAME]"}),
        ("--log-every", "log_every", {"type": int}),
        ("--breakdown", "breakdown", {"action": "store_true"}),
        ("--download", "download", {"action": "store_true"}),
        ("--deterministic", "deterministic", {"action": "store_true"}),
        ("--compile", "compile", {"action": argparse.BooleanOptionalAction}),
        ("--num-workers", "num_workers", {"type": int}),
        ("--threads", "threads", {"type": int}),
    ):
        add(flag, name, **kwargs)
    parser.add_argument(
        "--no-shuffle",
        dest="shuffle",
        action="store_false",
        default=d,
        help="keep the data's order (default: shuffle every epoch, seeded, the same at any world size)",
    )


def add_workload_arguments(parser: argparse.ArgumentParser, workload: type) -> None:
    """A flag per field of a workload's own options dataclass (``seq_len``: ``--seq-len``), typed by the
    field and described by its docstring; like the common options, each defaults to "not given"."""
    docs, hints = field_docs(workload), typing.get_type_hints(workload)
    for f in dataclasses.fields(workload):
        kind = hints[f.name]
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # X | None: the flag takes an X
            kind = next(a for a in typing.get_args(kind) if a is not type(None))
        shown = "" if f.default is None or isinstance(f.default, bool) else f" (default: {f.default})"
        kwargs: dict[str, Any] = {"action": argparse.BooleanOptionalAction} if kind is bool else {"type": kind}
        parser.add_argument(
            "--" + f.name.replace("_", "-"),
            dest=f.name,
            default=argparse.SUPPRESS,
            help=(docs[f.name] + shown).replace("%", "%%"),
            **kwargs,
        )


def options_from_args(
    args: argparse.Namespace,
    defaults: TrainOptions | None = None,
    environ: dict[str, str] | None = None,
    workload: type[W] | None = None,
) -> tuple[TrainOptions, W | None]:
    """defaults < config file (--config, [train] table) < TRAINSCALE_TRAIN_* < command line, for the common
    options and the ``workload``'s own ones alike (one table, one variable prefix)."""
    classes = (TrainOptions,) if workload is None else (TrainOptions, workload)
    names = {f.name for cls in classes for f in fields(cls)}
    given = {k: v for k, v in vars(args).items() if k in names}
    config = load_config_file(args.config) if getattr(args, "config", None) else None
    base = {f.name: getattr(defaults, f.name) for f in fields(TrainOptions)} if defaults else None
    built, _ = resolve_group(classes, section="train", defaults=base, config=config, environ=environ, cli=given)
    return built[0], (built[1] if workload is not None else None)


def parse(
    argv: Sequence[str],
    prog: str,
    defaults: TrainOptions | None = None,
    workload: type[W] | None = None,
    environ: dict[str, str] | None = None,
) -> tuple[TrainOptions, W | None]:
    """The common options and, with ``workload`` (a frozen dataclass), the workload's own ones, each from
    the command line, --config's [train] table or TRAINSCALE_TRAIN_<NAME>."""
    parser = Parser(
        prog=prog,
        hint=_launch_option_here,
        description="The workload's options (the launch options "
        "are in `trainscale run --help`). Each can also come from --config's [train] table or "
        "TRAINSCALE_TRAIN_<NAME>.",
    )
    add_common_arguments(parser, defaults)
    if workload is not None:
        add_workload_arguments(parser, workload)
    return options_from_args(parser.parse_args(list(argv)), defaults, environ, workload)


def _launch_option_here(message: str) -> str | None:
    """The fix for a launch option given after ``--workload`` (``run --workload cnn --nproc-per-node 2``)."""
    launch = {s for action in launch_parser()._actions for s in action.option_strings}
    misplaced = [name for name in unrecognized(message) if name in launch]
    if not misplaced:
        return None
    return (
        f"{', '.join(misplaced)}: launch option(s) go before --workload (trainscale run --nproc-per-node 2 "
        "--workload cnn ...)"
    )


def apply_threads(opts: TrainOptions, rt: Any) -> None:
    """``--threads``: this rank's CPU threads (torch's intra-op pool), said once on rank 0."""
    if opts.threads is None:
        return

    import torch  # noqa: PLC0415 (torch-free module)

    before = os.environ.get("OMP_NUM_THREADS")
    torch.set_num_threads(opts.threads)
    rt.print(f"trainscale: {opts.threads} CPU thread(s) per rank (--threads; OMP_NUM_THREADS was {before})")


def check_compile() -> None:
    """``--compile`` before launch: inductor turns the model into C++ (CPU) or Triton (GPU) code, and
    both need a C++ compiler on this machine."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler  # noqa: PLC0415 (optional dependency)

        get_cpp_compiler()
    except Exception as exc:  # torch raises its own error types for a missing or unusable compiler
        raise ConfigError(
            f"--compile needs a C++ compiler for torch.compile's inductor, and none works here "
            f"({str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__})",
            hint="install one (e.g. apt install g++, or set CXX), or leave --compile out",
        ) from None


def check_training(
    opts: TrainOptions,
    world_size: int,
    *,
    gpus: bool | None,
    samples: int | None,
    what: str,
    checkpoint_dir: str | Path | None,
) -> None:
    """A loop-based workload's preflight, before anything is launched: the strategy for this world size,
    batch and accumulation, ``--compile``, ``samples`` (when cheap to know) enough for every rank, and a
    ``--metrics-out`` that is new unless this run resumes from ``checkpoint_dir``."""
    from trainscale.checkpoint import list_checkpoints  # noqa: PLC0415 (torch-free module)
    from trainscale.data import check_shardable  # noqa: PLC0415 (torch-free module)
    from trainscale.strategies import check_strategy  # noqa: PLC0415 (torch-free module)
    from trainscale.train.metrics import check_metrics_out  # noqa: PLC0415 (torch-free module)

    # --device when given; with auto, what the ranks will have (``gpus``: a SLURM job planned on a login node
    # knows it from its resources), or this machine's choice when ``gpus`` is None
    device = opts.device if opts.device not in (None, "auto") or gpus is None else ("cuda" if gpus else "cpu")
    check_strategy(
        opts.strategy,
        world_size,
        batch_size=opts.batch_size,
        device=device,
        accumulation=opts.grad_accum,
        compile=opts.compile,
    )
    if opts.compile:
        check_compile()
    if samples is not None:
        check_shardable(samples, world_size, opts.batch_size, what=what)
    if checkpoint_dir:  # here, before any rank starts: refused in the workers it costs a start of every rank
        from trainscale.checkpoint.disk import unusable  # noqa: PLC0415 (torch-free module)

        problem = unusable(Path(checkpoint_dir))
        if problem is not None:
            raise ConfigError(
                f"--checkpoint-dir {checkpoint_dir} is unusable: {problem}",
                hint="point --checkpoint-dir at a directory you can write to (created if missing), "
                "or fix its permissions / remount it read-write",
            )
    resuming = bool(checkpoint_dir) and not opts.fresh and bool(list_checkpoints(Path(checkpoint_dir)))
    check_metrics_out(opts.metrics_out, resuming=resuming, checkpoints=checkpoint_dir)
