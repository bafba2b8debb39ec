"""What a SLURM job asks for: a typed, validated spec, and the numbers derived from it and a profile.

Plan, then do: :class:`SlurmJobSpec` holds what the user said; :func:`resolve` turns it and a
:class:`~trainscale.profiles.schema.ClusterProfile` into a :class:`JobPlan` in which every number the
batch script needs is computed once (tasks, CPUs, memory, threads, binding), so the script never
repeats a number by hand. Both the renderer and the linter read the plan.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from trainscale.errors import ConfigError, did_you_mean
from trainscale.profiles.schema import LAUNCHERS, ClusterProfile

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_MEM = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]?)B?$", re.IGNORECASE)
_SIGNAL = re.compile(r"^(?:[RB]:)?(?:SIG)?([A-Z][A-Z0-9]*|\d+)(?:@(\d+))?$")
_JOB_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def parse_time(text: str) -> int:
    """SLURM time (``MM``, ``HH:MM:SS``, ``D-HH[:MM[:SS]]``, ``MM:SS``) -> seconds."""
    m = _TIME.match(text.strip())
    if not m:
        raise ConfigError(f"time {text!r} is not a SLURM time", hint="write HH:MM:SS or D-HH:MM:SS, e.g. --time 01:30:00")
    days, a, b, c = m.groups()
    parts = [int(x) for x in (a, b, c) if x is not None]
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        parts += [0] * (3 - len(parts))
        hours, minutes, seconds = parts
        return int(days) * 86400 + hours * 3600 + minutes * 60 + seconds
    if len(parts) == 1:  # minutes
        return parts[0] * 60
    if len(parts) == 2:  # MM:SS
        return parts[0] * 60 + parts[1]
    return parts[0] * 3600 + parts[1] * 60 + parts[2]


def format_time(seconds: int) -> str:
    days, rest = divmod(int(seconds), 86400)
    hms = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{hms}" if days else hms


def parse_mem_gb(text: str) -> float:
    """``60G``, ``512M``, ``1T`` (SLURM's default unit is MB) -> GB."""
    m = _MEM.match(str(text).strip())
    if not m:
        raise ConfigError(f"memory {text!r} is not a SLURM size", hint="write a number with a unit, e.g. 60G or 500M")
    value, unit = float(m.group(1)), (m.group(2) or "M").upper()
    return value * {"K": 1 / 1024**2, "M": 1 / 1024, "G": 1.0, "T": 1024.0}[unit]


def _positive(name: str, value: int | None) -> None:
    if value is not None and value < 1:
        raise ConfigError(f"{name}={value}: must be at least 1", hint=f"leave {name} out to derive it from the profile")


@dataclass(frozen=True, kw_only=True)
class SlurmJobSpec:
    """One training job on a SLURM cluster, as the user asked for it."""

    script: str | None = None
    """Path of the training script (exactly one of script, module, workload)."""
    module: str | None = None
    """A module to run as ``python -m MODULE``."""
    workload: str | None = None
    """A built-in workload name (cnn, vit, gpt, hf-finetune)."""
    args: tuple[str, ...] = ()
    """Arguments for the script, module or workload."""
    profile: str = "generic-nvidia"
    """Name of the cluster profile (``trainscale profiles`` lists them)."""
    nodes: int = 1
    """Nodes to allocate."""
    gpus_per_node: int | None = None
    """GPUs per node; on CPU-only profiles the ranks per node. None: the profile's count (or 1)."""
    time: str
    """Time limit, HH:MM:SS or D-HH:MM:SS."""
    account: str | None = None
    """Project/account to charge (``--account``)."""
    partition: str | None = None
    """Partition; None: the profile's default."""
    reservation: str | None = None
    """Reservation name (``--reservation``)."""
    mem_per_gpu: str | None = None
    """Memory per GPU (per rank on CPU-only profiles), e.g. 60G; None: the profile's default."""
    cpus_per_gpu: int | None = None
    """``--cpus-per-gpu`` (refused on profiles where it breaks GPU communication)."""
    cpus_per_task: int | None = None
    """``--cpus-per-task``; None: derived from the profile and the launch mode."""
    tasks_per_node: int | None = None
    """Override of ``--ntasks-per-node``; normally derived from the launch mode (lint checks it)."""
    cpu_bind: str | None = None
    """Explicit ``srun --cpu-bind`` value; None: from the profile's map in srun mode."""
    container: str | None = None
    """Container image to run in (the profile says singularity or apptainer, and the binds)."""
    launcher: str | None = None
    """torchrun (one task per node) or srun (one task per rank); None: the profile's default."""
    job_name: str | None = None
    """Job name; None: ``trainscale-<script or workload>``."""
    output_dir: Path = Path("trainscale-jobs")
    """Where the batch script, the batch output and the per-job directory ``<job_name>-<id>/`` go."""
    signal: str | None = None
    """Warning signal before the time limit, e.g. ``USR1@90`` (sbatch ``--signal``)."""
    requeue: bool = False
    """Let SLURM requeue the job (``--requeue``) after preemption or node failure."""
    extra_sbatch: tuple[str, ...] = ()
    """More ``#SBATCH`` options, e.g. ``--constraint=a100`` (lint checks them against the plan)."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables exported in the batch script (after the profile's)."""
    python: str | None = None
    """Python that runs trainscale on the nodes; None: this interpreter (``python3`` in a container)."""
    master_port: int | None = None
    """Rendezvous port; None: a free one chosen on the first node when the job starts."""
    dataloader_workers: int = 0
    """DataLoader worker processes per rank (lint checks each rank has CPUs for them)."""
    command_line: tuple[str, ...] = ()
    """The command that produced this job, recorded in the script's header."""

    def __post_init__(self) -> None:
        chosen = [x for x in (self.script, self.module, self.workload) if x]
        if len(chosen) != 1:
            raise ConfigError("give exactly one of a SCRIPT, --module MODULE or --workload NAME"
                              if chosen else "nothing to run",
                              hint="e.g. trainscale slurm train.py --profile lumi ..., or --workload cnn")
        if self.nodes < 1:
            raise ConfigError(f"--nodes {self.nodes}: at least one node is needed", hint="use --nodes 1 or more")
        for name in ("gpus_per_node", "cpus_per_gpu", "cpus_per_task", "tasks_per_node"):
            _positive(name.replace("_", "-"), getattr(self, name))
        parse_time(self.time)
        if self.launcher is not None and self.launcher not in LAUNCHERS:
            raise ConfigError(f"--launcher {self.launcher!r} unknown", hint=did_you_mean(self.launcher, LAUNCHERS))
        if self.mem_per_gpu is not None:
            parse_mem_gb(self.mem_per_gpu)
        if self.signal is not None and not _SIGNAL.match(self.signal):
            raise ConfigError(f"--signal {self.signal!r} is not SIG[@SECONDS]",
                              hint="e.g. --signal USR1@90 (SIGUSR1 90 s before the time limit)")
        if self.job_name is not None and not _JOB_NAME.match(self.job_name):
            raise ConfigError(f"--job-name {self.job_name!r} has characters that do not belong in a file name",
                              hint="use letters, digits, '.', '_' and '-'")
        if self.master_port is not None and not 1024 <= self.master_port < 65536:
            raise ConfigError(f"master port {self.master_port} out of range", hint="use 1024-65535, or leave it out")
        if self.dataloader_workers < 0:
            raise ConfigError(f"dataloader_workers={self.dataloader_workers} is negative", hint="use 0 or more")
        for line in self.extra_sbatch:
            if not line.strip().startswith("-"):
                raise ConfigError(f"extra sbatch option {line!r} is not an option",
                                  hint="write it as on the sbatch command line, e.g. --constraint=a100")

    @property
    def name(self) -> str:
        if self.job_name:
            return self.job_name
        stem = self.workload or (self.module or "").rsplit(".", 1)[-1] or Path(self.script or "job").stem
        return "trainscale-" + re.sub(r"[^A-Za-z0-9._-]", "_", stem)


@dataclass(frozen=True, kw_only=True)
class JobPlan:
    """Every number the batch script needs, derived once from a spec and a profile."""

    launcher: str
    nodes: int
    ranks_per_node: int
    tasks_per_node: int
    cpus_per_task: int | None
    cpus_per_rank: int
    gpus_per_node: int
    partition: str | None
    mem_per_gpu: str | None
    mem_per_node: str | None
    rank_cpus: tuple[tuple[int, ...], ...]
    """Per local rank, the cores from the profile's map (empty when the profile has no map)."""
    output_dir: Path
    time_s: int

    @property
    def world_size(self) -> int:
        return self.ranks_per_node * self.nodes


def usable_cpus(profile: ClusterProfile) -> int:
    return max(1, profile.cpus_per_node - len(profile.reserved_cores))


def binding_plan(profile: ClusterProfile, ranks: int) -> tuple[tuple[int, ...], ...]:
    """Per local rank, the cores the profile's map gives it (GPU-local first, reserved excluded); () without a map."""
    if profile.binding != "map" or (profile.gpus_per_node and ranks > profile.gpus_per_node):
        return ()  # more ranks than GPUs: lint reports it
    from trainscale.profiles import binding_plan as plan_for

    plan = plan_for(profile, ranks)
    return tuple(r.cpus for r in plan.ranks) if plan else ()


def resolve(spec: SlurmJobSpec, profile: ClusterProfile) -> JobPlan:
    """Derive the plan; consistency problems are left for :func:`~trainscale.launch.slurm.lint.lint`."""
    launcher = spec.launcher or profile.default_launcher
    gpu = profile.gpus_per_node > 0
    ranks = spec.gpus_per_node or profile.gpus_per_node or 1
    rank_cpus = binding_plan(profile, ranks)
    tasks = spec.tasks_per_node or (1 if launcher == "torchrun" else ranks)
    if spec.cpus_per_gpu:
        per_rank = spec.cpus_per_gpu
    elif spec.cpus_per_task:
        per_rank = max(1, spec.cpus_per_task * tasks // ranks)
    elif rank_cpus and all(rank_cpus):
        per_rank = min(len(c) for c in rank_cpus)
    else:
        per_rank = max(1, usable_cpus(profile) // ranks)
    if spec.cpus_per_gpu and not spec.cpus_per_task:
        cpus_per_task = None  # --cpus-per-gpu already says it; do not bind the same CPUs twice
    else:
        cpus_per_task = spec.cpus_per_task or per_rank * ranks // tasks
    mem_per_gpu = spec.mem_per_gpu or (f"{profile.mem_per_gpu_gb:g}G" if profile.mem_per_gpu_gb else None)
    mem_per_node = None
    if mem_per_gpu and not gpu:  # CPU-only: memory per rank, asked for per node
        mem_per_node = f"{parse_mem_gb(mem_per_gpu) * ranks:g}G"
        mem_per_gpu = None
    return JobPlan(
        launcher=launcher, nodes=spec.nodes, ranks_per_node=ranks, tasks_per_node=tasks, cpus_per_task=cpus_per_task,
        cpus_per_rank=per_rank, gpus_per_node=ranks if gpu else 0,
        partition=spec.partition or profile.default_partition, mem_per_gpu=mem_per_gpu, mem_per_node=mem_per_node,
        rank_cpus=rank_cpus, output_dir=Path(spec.output_dir).absolute(), time_s=parse_time(spec.time),
    )
