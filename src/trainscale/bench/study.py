"""A scaling study: spec -> plan (pure, every error before any launch) -> run each configuration.

Each configuration is started through the same launcher as ``trainscale run`` (torch's elastic
agent), so what is measured is what a user gets: its steps, from the records every run writes
(observe/reading.py), a built-in workload's and a plain script's alike. A workload also writes its results
(losses, accuracy) with ``--metrics-out``.
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from trainscale.bench.configs import (
    RunConfig,
    find_baseline,
    int_tuple,
    parse_configs,
    per_rank_batch,
    scaled_max_steps,
)
from trainscale.bench.slurm_runs import SlurmTarget
from trainscale.errors import ConfigError
from trainscale.workloads.registry import get_workload, workload_preflight

BATCH_ENV = "TRAINSCALE_BATCH"


@dataclass(frozen=True, kw_only=True)
class StudySpec:
    """What to measure, where, and where the results go. ``trainscale bench`` resolves it in the one order
    (``bench/options.py``: a ``[bench]`` table, ``TRAINSCALE_BENCH_<FIELD>``, the command line)."""

    workload: str | None = None
    """Built-in workload name (``--workload cnn``); or give ``script``."""
    script: str | None = None
    """A user script that uses trainscale's runtime."""
    script_args: tuple[str, ...] = ()
    """Arguments for the script; ``{batch}`` is replaced by each run's per-rank batch."""
    configs: str = "1,2"
    """Configuration tokens, comma-separated (cpu, N, NxM, Nn)."""
    scaling: str = "weak"
    """weak: ``batch_size`` per rank (seed 004's recipe); strong: ``batch_size`` is the fixed global batch."""
    batch_size: int = 16
    """Per rank (weak) or global (strong) batch."""
    epochs: int = 2
    """Epochs per run."""
    max_steps: int | None = None
    """Stop each run after this many steps (scaled in weak scaling so every run does the same work)."""
    data: str | None = None
    """Data source for the workload (digits, mnist, synthetic)."""
    samples: int | None = None
    """Synthetic training samples."""
    workload_args: tuple[str, ...] = ()
    """More arguments for the workload (after ``--``)."""
    baseline: str | None = None
    """Token speedups are measured against (default: the first configuration)."""
    sweep_batches: tuple[int, ...] = ()
    """Per-rank batch sizes to sweep (batch-size sweep mode)."""
    out_dir: Path | None = None
    """Results directory; default bench-out/<timestamp>. Never an existing study."""
    gpus_visible: int = 0
    """GPUs on this node (decides what ``1`` and ``N`` mean)."""
    slurm: SlurmTarget | None = None
    """Run each configuration as a SLURM job (``--slurm``) instead of on this node."""

    def __post_init__(self) -> None:
        # a command line, a variable and a TOML file spell these differently: one form from here on
        object.__setattr__(self, "sweep_batches", int_tuple(self.sweep_batches, "--sweep-batch"))
        if not isinstance(self.configs, str):  # configs = ["cpu", 1, 2] or configs = 2
            tokens = self.configs if isinstance(self.configs, (list, tuple)) else (self.configs,)
            object.__setattr__(self, "configs", ",".join(str(t) for t in tokens))
        if isinstance(self.out_dir, str):
            object.__setattr__(self, "out_dir", Path(self.out_dir) if self.out_dir else None)
        if self.workload and self.script:
            raise ConfigError(
                f"both --workload {self.workload} and script {self.script!r} given", hint="benchmark one of them"
            )
        if self.script and not Path(self.script).is_file():
            raise ConfigError(
                f"script {self.script!r} does not exist",
                hint="give the path of a training script, or --workload NAME (`trainscale run --help` lists them)",
            )
        if (self.workload is None) == (self.script is None):
            raise ConfigError(
                "give exactly one of --workload NAME or SCRIPT",
                hint="e.g. trainscale bench --workload cnn --configs 1,2, or trainscale bench train.py",
            )
        if self.epochs < 1:
            raise ConfigError(f"--epochs {self.epochs} must be >= 1", hint="e.g. --epochs 2")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"--max-steps {self.max_steps} must be >= 1", hint="leave it out to run whole epochs")
        if self.samples is not None and self.samples < 1:
            raise ConfigError(f"--samples {self.samples} must be >= 1", hint="e.g. --samples 4096")
        if self.sweep_batches and self.scaling == "strong":
            raise ConfigError(
                "--sweep-batch sweeps the per-rank batch, which strong scaling fixes",
                hint="drop --scaling strong for a sweep",
            )

    @property
    def cpu_ranks(self) -> bool:
        """Whether a configuration N runs N CPU ranks: on this node, no GPU visible, and not only ``cpu``."""
        here = self.slurm is None and self.gpus_visible == 0
        return here and any(t.strip() != "cpu" for t in self.configs.split(","))

    @property
    def target(self) -> str:
        return f"workload {self.workload}" if self.workload else f"script {self.script}"

    def parsed_configs(self) -> tuple[RunConfig, ...]:
        if self.slurm is None:
            return parse_configs(self.configs, gpus_visible=self.gpus_visible)
        return parse_configs(
            self.configs,
            gpus_visible=self.slurm.cluster.gpus_per_node,
            slurm=True,
            ranks_per_node=self.slurm.nodes_ranks,
        )


@dataclass(frozen=True)
class PlannedRun:
    name: str
    """Directory name of this run inside the study (``01-cpu``)."""
    config: RunConfig
    per_rank_batch: int
    global_batch: int
    max_steps: int | None
    args: tuple[str, ...]
    sweep: bool = False


@dataclass
class Plan:
    spec: StudySpec
    configs: tuple[RunConfig, ...]
    baseline: RunConfig
    runs: list[PlannedRun] = field(default_factory=list)


def _workload_args(spec: StudySpec, config: RunConfig, batch: int, max_steps: int | None) -> tuple[str, ...]:
    # hf-finetune's Trainer sizes its batch globally; the study's batch is per rank for every workload.
    sizing = (
        ["--global-batch", str(batch * config.world_size)]
        if spec.workload == "hf-finetune"
        else ["--batch-size", str(batch)]
    )
    args = ["--epochs", str(spec.epochs), *sizing, "--log-every", "0"]
    if max_steps is not None:
        args += ["--max-steps", str(max_steps)]
    if spec.data:
        args += ["--data", spec.data]
    if spec.samples is not None:
        args += ["--samples", str(spec.samples)]
    if config.device == "cpu":
        args += ["--device", "cpu"]
    return (*args, *spec.workload_args)


def plan(spec: StudySpec) -> Plan:
    """Every run of the study with its batch sizes and arguments; raises ConfigError before any launch, the
    workload's own checks (options, data large enough for every rank) included."""
    configs = spec.parsed_configs()
    baseline = find_baseline(configs, spec.baseline)
    if spec.workload:
        get_workload(spec.workload)
    out = Plan(spec, configs, baseline)
    batches = spec.sweep_batches or (spec.batch_size,)
    index = 0
    for config in configs:
        for batch_option in batches:
            index += 1
            batch = batch_option if spec.sweep_batches else per_rank_batch(config, batch_option, spec.scaling)
            steps = scaled_max_steps(spec.max_steps, config, baseline, "weak" if spec.sweep_batches else spec.scaling)
            args = (
                _workload_args(spec, config, batch, steps)
                if spec.workload
                else tuple(a.replace("{batch}", str(batch)) for a in spec.script_args)
            )
            slug = re.sub(r"[^a-zA-Z0-9]+", "-", config.token).strip("-") or "run"
            name = f"{index:02d}-{slug}" + (f"-b{batch}" if spec.sweep_batches else "")
            out.runs.append(
                PlannedRun(name, config, batch, batch * config.world_size, steps, args, bool(spec.sweep_batches))
            )
    check = workload_preflight(spec.workload) if spec.workload else None
    for run in out.runs if check else ():
        try:
            # a GPU configuration planned where no GPU is (a login node) is checked for its GPUs
            check(list(run.args), run.config.world_size, gpus=run.config.gpus or None)
        except ConfigError as exc:
            raise ConfigError(
                f"configuration {run.config.token!r} (batch {run.per_rank_batch} per rank): {exc.message}",
                hint=exc.hint,
            ) from None
    return out


def choose_out_dir(
    requested: Path | None,
    root: Path = Path("bench-out"),
    now: datetime.datetime | None = None,
    *,
    kept: str = "a study is never overwritten",
) -> Path:
    """A fresh directory for the study, ``root/<timestamp>`` unless ``requested``: never one that holds
    anything already (``kept``: the refusal's reason)."""
    if requested is not None:
        if requested.exists() and any(requested.iterdir()):
            raise ConfigError(
                f"--out {requested} already exists and is not empty; {kept}",
                hint=f"give a new directory, or leave --out out for {root}/<timestamp>",
            )
        return requested
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
    candidate, k = root / stamp, 1
    while candidate.exists():
        k += 1
        candidate = root / f"{stamp}-{k}"
    return candidate


def read_metrics(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None
