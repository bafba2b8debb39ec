"""Options every built-in workload accepts, parsed into a validated dataclass."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from typing import Sequence

from trainscale.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """The common knobs of a built-in workload."""

    epochs: int = 5
    """Passes over the training data (ignored once --max-steps is reached)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps."""
    batch_size: int = 16
    """Samples per rank per step."""
    lr: float = 1e-3
    """Learning rate."""
    seed: int = 0
    """Seed for model initialisation and shuffling (same on every rank)."""
    strategy: str = "ddp"
    """ddp, zero1, fsdp or deepspeed."""
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
    """Save checkpoints here and resume from the newest one."""
    checkpoint_every: int = 0
    """Save every N optimizer steps (0: at the end of every epoch only)."""
    metrics_out: str | None = None
    """Write per-epoch metrics as JSON here (rank 0)."""
    timeout_s: float = 1800.0
    """Collective timeout in seconds: a rank that stops participating becomes an error after this."""
    log_every: int = 100
    """Print a progress line every N steps on rank 0 (0: never)."""
    breakdown: bool = False
    """Time data loading, forward+backward, communication and optimizer step separately (adds syncs)."""
    download: bool = False
    """Download real data when missing (rank 0 first; needs a network)."""

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ConfigError(f"--epochs {self.epochs} must be >= 1", hint="e.g. --epochs 5")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"--max-steps {self.max_steps} must be >= 1", hint="leave it out to run whole epochs")
        if self.batch_size < 1:
            raise ConfigError(f"--batch-size {self.batch_size} must be >= 1",
                              hint="the batch size is per rank, e.g. --batch-size 16")
        if not self.lr > 0:
            raise ConfigError(f"--lr {self.lr} must be > 0", hint="e.g. --lr 0.001")
        if self.loader not in ("tensor", "dataloader"):
            raise ConfigError(f"--loader {self.loader!r} unknown", hint="use tensor or dataloader")
        if self.checkpoint_every < 0:
            raise ConfigError(f"--checkpoint-every {self.checkpoint_every} is negative", hint="use 0 or more steps")
        if self.samples < 1:
            raise ConfigError(f"--samples {self.samples} must be >= 1", hint="e.g. --samples 60000")
        if self.timeout_s <= 0:
            raise ConfigError(f"--timeout {self.timeout_s} must be > 0", hint="seconds, e.g. --timeout 600")


def add_common_arguments(parser: argparse.ArgumentParser, defaults: TrainOptions | None = None) -> None:
    """The common options. Defaults are applied by :func:`parse` (so a config file or the environment
    can sit between them and the command line); here every option defaults to "not given"."""
    d = argparse.SUPPRESS
    parser.add_argument("--config", default=None, help="TOML file with a [train] table (see docs/architecture.md)")
    parser.add_argument("--epochs", type=int, default=d)
    parser.add_argument("--max-steps", type=int, default=d)
    parser.add_argument("--batch-size", type=int, default=d, help="per rank")
    parser.add_argument("--lr", type=float, default=d)
    parser.add_argument("--seed", type=int, default=d)
    parser.add_argument("--strategy", default=d)
    parser.add_argument("--device", default=d)
    parser.add_argument("--data", default=d)
    parser.add_argument("--data-dir", default=d)
    parser.add_argument("--samples", type=int, default=d)
    parser.add_argument("--loader", default=d, choices=("tensor", "dataloader"))
    parser.add_argument("--no-shuffle", dest="shuffle", action="store_false", default=d)
    parser.add_argument("--checkpoint-dir", default=d)
    parser.add_argument("--checkpoint-every", type=int, default=d)
    parser.add_argument("--metrics-out", default=d)
    parser.add_argument("--timeout", dest="timeout_s", type=float, default=d)
    parser.add_argument("--log-every", type=int, default=d)
    parser.add_argument("--breakdown", action="store_true", default=d)
    parser.add_argument("--download", action="store_true", default=d)


def options_from_args(args: argparse.Namespace, defaults: TrainOptions | None = None,
                      environ: dict[str, str] | None = None) -> TrainOptions:
    """defaults < config file (--config, [train] table) < TRAINSCALE_TRAIN_* < command line."""
    from trainscale.config import load_config_file, resolve

    names = {f.name for f in fields(TrainOptions)}
    given = {k: v for k, v in vars(args).items() if k in names}
    config = load_config_file(args.config) if getattr(args, "config", None) else None
    base = {f.name: getattr(defaults, f.name) for f in fields(TrainOptions)} if defaults else None
    opts, _ = resolve(TrainOptions, section="train", defaults=base, config=config, environ=environ, cli=given)
    for name in names:  # workloads may read their options from the namespace too
        setattr(args, name, getattr(opts, name))
    return opts


def parse(argv: Sequence[str], prog: str, defaults: TrainOptions | None = None,
          extra: callable | None = None) -> tuple[TrainOptions, argparse.Namespace]:
    parser = argparse.ArgumentParser(prog=prog)
    add_common_arguments(parser, defaults)
    if extra:
        extra(parser)
    args = parser.parse_args(list(argv))
    return options_from_args(args, defaults), args


def planned_device(device: str, gpus: bool | None) -> str:
    """The device a preflight checks for: ``--device`` when given; with ``auto``, what the ranks will
    have (``gpus``: a SLURM job planned on a login node knows it from its resources), or this machine's
    choice when ``gpus`` is None."""
    if device not in (None, "auto") or gpus is None:
        return device
    return "cuda" if gpus else "cpu"
