"""What a SLURM job asks for: a typed, validated spec, and the numbers derived from it and a profile.

Plan, then do: :class:`SlurmJobSpec` holds what the user said; :func:`resolve` turns it and a
:class:`~trainscale.profiles.schema.ClusterProfile` into a :class:`JobPlan` in which every number the
batch script needs is computed once (tasks, CPUs, memory, threads, binding), so the script never
repeats a number by hand. Both the renderer and the linter read the plan.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from trainscale.errors import ConfigError, did_you_mean
from trainscale.launch.slurm.layout import code_root_for
from trainscale.launch.slurm.script import ScriptFacts, script_facts
from trainscale.profiles.schema import LAUNCHERS, ClusterProfile

_TIME = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_MEM = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]?)B?$", re.IGNORECASE)
_SIGNAL = re.compile(r"^(?:[RB]:)?(?:SIG)?([A-Z][A-Z0-9]*|\d+)(?:@(\d+))?$")
_JOB_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
_ARRAY = re.compile(r"^\d+(-\d+)?(:\d+)?(,\d+(-\d+)?(:\d+)?)*(%\d+)?$")
GPU_VISIBILITY = ("auto", "task", "node")
CONTAINER_MODES = ("exec", "run")
MAIL_TYPES = (
    "NONE",
    "BEGIN",
    "END",
    "FAIL",
    "REQUEUE",
    "ALL",
    "INVALID_DEPEND",
    "STAGE_OUT",
    "TIME_LIMIT",
    "TIME_LIMIT_90",
    "TIME_LIMIT_80",
    "TIME_LIMIT_50",
    "ARRAY_TASKS",
)


UNLIMITED = -1
"""parse_time's value for ``UNLIMITED``/``INFINITE`` (no time limit; the partition's own applies)."""


def parse_time(text: str) -> int:
    """Every time format sbatch accepts -> seconds: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``,
    ``D-H:M:S``; ``UNLIMITED``/``INFINITE`` (and ``-1``) give :data:`UNLIMITED`."""
    if text.strip().upper() in ("UNLIMITED", "INFINITE", "-1"):
        return UNLIMITED
    m = _TIME.match(text.strip())
    if not m:
        raise ConfigError(
            f"time {text!r} is not a SLURM time",
            hint="write it as sbatch does: MINUTES, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or "
            "UNLIMITED, e.g. --time 01:30:00 or -t 1-12",
        )
    days, *rest = m.groups()
    parts = [int(x) for x in rest if x is not None]
    over = any(p >= 60 for p in parts[1:]) or (days is not None and bool(parts) and parts[0] >= 24)
    if days is not None:  # D-HH, D-HH:MM, D-HH:MM:SS
        parts += [0] * (3 - len(parts))
    units = (3600, 60, 1) if len(parts) == 3 else (60, 1)  # H:M:S; M or M:S
    seconds = int(days or 0) * 86400 + sum(p * u for p, u in zip(parts, units))
    if over:  # sbatch would read it otherwise than it is written
        raise ConfigError(
            f"time {text!r}: minutes and seconds after the first field are 0-59, hours 0-23 after a day count",
            hint=f"write it as --time {format_time(seconds)}",
        )
    return seconds


def format_time(seconds: int) -> str:
    if seconds == UNLIMITED:
        return "UNLIMITED"
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


@dataclass(frozen=True, kw_only=True)
class SlurmJobSpec:
    """One training job on a SLURM cluster, as the user asked for it (sbatch's names where sbatch has one)."""

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
    """Nodes to run on (``-N``; of ``--nodes MIN-MAX``, MAX)."""
    min_nodes: int | None = None
    """``--nodes MIN-MAX``: the job continues on as few as MIN nodes after losing some (None: ``nodes``)."""
    spare_nodes: int = 0
    """``--spare-nodes K``: nodes allocated beside ``nodes`` that the job starts on once one of its nodes fails."""
    gpus_per_node: int | None = None
    """GPUs per node; on CPU-only profiles the ranks per node. None: from ``ntasks``, else the profile's count
    (or 1)."""
    gpu_type: str | None = None
    """GPU type for ``--gpus-per-node TYPE:N`` (e.g. a100), as the site names it."""
    ntasks: int | None = None
    """Total ranks (``-n``); with ``--nodes`` it gives the ranks per node when --gpus-per-node is not given."""
    time: str
    """Time limit in any form sbatch accepts (``-t``)."""
    account: str | None = None
    """Project/account to charge (``-A``)."""
    partition: str | None = None
    """Partition (``-p``); None: the profile's default."""
    reservation: str | None = None
    """Reservation name (``--reservation``)."""
    qos: str | None = None
    """Quality of service (``-q``)."""
    constraint: str | None = None
    """Node features (``-C``)."""
    exclusive: bool = False
    """Whole nodes for this job only (``--exclusive``)."""
    mem: str | None = None
    """Memory per node (``--mem``), e.g. 400G; replaces the per-GPU default."""
    mem_per_gpu: str | None = None
    """Memory per GPU (per rank on CPU-only profiles), e.g. 60G; None: the profile's default."""
    cpus_per_gpu: int | None = None
    """``--cpus-per-gpu`` (refused on profiles where it breaks GPU communication)."""
    cpus_per_task: int | None = None
    """``--cpus-per-task`` (``-c``); None: derived from the profile and the launch mode."""
    tasks_per_node: int | None = None
    """Override of ``--ntasks-per-node``; normally derived from the launch mode (lint checks it)."""
    cpu_bind: str | None = None
    """Explicit ``srun --cpu-bind`` value; None: from the profile's map in srun mode."""
    gpu_bind: str | None = None
    """``--gpu-bind`` for the job's steps (then SLURM, not trainscale, decides what each task sees)."""
    gpu_visibility: str = "auto"
    """srun mode on GPUs: ``task`` (each task sees only its own GPU), ``node`` (every GPU of the node) or
    ``auto`` (task, unless the script picks its GPU by a rank index such as ``cuda:{local_rank}``)."""
    container: str | None = None
    """Container image to run in (the profile says singularity or apptainer, and the binds)."""
    container_mode: str | None = None
    """``exec`` (the default) or ``run`` (the image's runscript sets up its environment first)."""
    container_setup: tuple[str, ...] = ()
    """Shell lines run inside the container before Python (LUMI's older images: ``$WITH_CONDA``)."""
    binds: tuple[str, ...] = ()
    """More paths bound into the container, ``SRC[:DST[:OPTS]]`` as singularity's ``--bind``."""
    modules: tuple[str, ...] = ()
    """Module lines for this job, after the profile's (``--module 'load PyTorch/2.4'``; ``module`` is added)."""
    profile_modules: bool = True
    """False (``--no-profile-modules``): leave the profile's module lines out; only ``modules`` run."""
    setup: tuple[str, ...] = ()
    """Shell lines run in the batch script before launch (after modules and environment)."""
    launcher: str | None = None
    """torchrun (one task per node) or srun (one task per rank); None: the profile's default."""
    job_name: str | None = None
    """Job name (``-J``); None: ``trainscale-<script or workload>``."""
    output_dir: Path = Path("trainscale-jobs")
    """Where each submission's run directory ``<job_name>-<date>-<time>/`` goes (launch/slurm/layout.py)."""
    run_name: str | None = None
    """The run directory's name under output_dir; None: ``<job_name>-<date>-<time>`` of the submission."""
    output: str | None = None
    """The batch step's output file (``-o``, sbatch's patterns); None: ``<output_dir>/<job_name>-%j.out``."""
    error: str | None = None
    """The batch step's error file (``-e``); None: with the output."""
    signal: str | None = None
    """Warning signal before the time limit, e.g. ``USR1@90`` (sbatch ``--signal``)."""
    requeue: bool | None = None
    """``--requeue`` (True), ``--no-requeue`` (False), or the site's JobRequeue default (None)."""
    max_requeues: int = 3
    """With --requeue: requeues after which the job stops instead (counted by SLURM_RESTART_COUNT)."""
    chain: int = 1
    """Jobs to submit, each starting after the previous ends (``afterany``), resuming the same run."""
    snapshot: str | None = None
    """The directory copied into the run at submission (launch/slurm/snapshot.py); None: the script's project root.
    Given, it also leads the job's PYTHONPATH (``-m pkg.mod`` imports from the copy)."""
    sweep: bool = False
    """An array job of a sweep (``trainscale sweep``): task I appends the arguments in the run's
    ``tasks/I.args`` and works in its own ``task-I/`` directory."""
    dependency: str | None = None
    """``-d``: start after other jobs, e.g. ``afterok:1234``."""
    array: str | None = None
    """``-a``: a job array, e.g. ``0-7%2``."""
    mail_type: str | None = None
    """``--mail-type``, e.g. ``END,FAIL``."""
    mail_user: str | None = None
    """``--mail-user``."""
    export: str | None = None
    """``--export`` (ALL, NONE or a variable list); None: sbatch's default (ALL)."""
    chdir: str | None = None
    """``-D``: the batch script's working directory."""
    extra_sbatch: tuple[str, ...] = ()
    """More ``#SBATCH`` options, e.g. ``--licenses=scratch`` (lint checks them against the plan)."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables exported in the batch script (after the profile's)."""
    python: str | None = None
    """Python that runs on the nodes; None: ``python3`` as found after the module lines or inside the container,
    else this interpreter (launch/slurm/toolchain.py)."""
    master_port: int | None = None
    """Rendezvous port; None: a free one chosen on the first node when the job starts."""
    dataloader_workers: int = 0
    """DataLoader worker processes per rank (lint checks each rank has CPUs for them)."""
    command_line: tuple[str, ...] = ()
    """The command that produced this job, recorded in the script's header."""

    @property
    def heals(self) -> bool:
        """Whether a node lost mid-run is left out and the run resumes on the others in the same allocation."""
        return self.spare_nodes > 0 or (self.min_nodes is not None and self.min_nodes < self.nodes)

    def __post_init__(self) -> None:
        chosen = [x for x in (self.script, self.module, self.workload) if x]
        if len(chosen) != 1:
            raise ConfigError(
                "give exactly one of a SCRIPT, --module MODULE or --workload NAME" if chosen else "nothing to run",
                hint="e.g. trainscale slurm train.py --profile lumi ..., or --workload cnn",
            )
        if self.nodes < 1:
            raise ConfigError(f"--nodes {self.nodes}: at least one node is needed", hint="use --nodes 1 or more")
        for name in ("gpus-per-node", "cpus-per-gpu", "cpus-per-task", "tasks-per-node", "ntasks"):
            if (value := getattr(self, name.replace("-", "_"))) is not None and value < 1:
                raise ConfigError(
                    f"{name}={value}: must be at least 1", hint=f"leave {name} out to derive it from the profile"
                )
        if self.ntasks is not None and self.ntasks % self.nodes:
            raise ConfigError(
                f"-n/--ntasks {self.ntasks} is not a multiple of --nodes {self.nodes}",
                hint=f"trainscale runs the same number of ranks on every node: use -n "
                f"{self.nodes * max(1, self.ntasks // self.nodes)}, or --gpus-per-node",
            )
        parse_time(self.time)
        if self.launcher is not None and self.launcher not in LAUNCHERS:
            raise ConfigError(f"--launcher {self.launcher!r} unknown", hint=did_you_mean(self.launcher, LAUNCHERS))
        for mem in (self.mem, self.mem_per_gpu):
            if mem is not None:
                parse_mem_gb(mem)
        if self.mem and self.mem_per_gpu:
            raise ConfigError("both --mem and --mem-per-gpu", hint="give one: SLURM refuses both in one job")
        if self.signal is not None and not _SIGNAL.match(self.signal):
            raise ConfigError(
                f"--signal {self.signal!r} is not SIG[@SECONDS]",
                hint="e.g. --signal USR1@90 (SIGUSR1 90 s before the time limit)",
            )
        for what, name in (("run name", self.run_name), ("--job-name", self.job_name)):
            if name is not None and not _JOB_NAME.match(name):
                raise ConfigError(
                    f"{what} {name!r} has characters that do not belong in a file name",
                    hint="use letters, digits, '.', '_' and '-'",
                )
        if self.master_port is not None and not 1024 <= self.master_port < 65536:
            raise ConfigError(f"master port {self.master_port} out of range", hint="use 1024-65535, or leave it out")
        if self.min_nodes is not None and not 1 <= self.min_nodes <= self.nodes:
            raise ConfigError(
                f"--nodes {self.min_nodes}-{self.nodes}: MIN must be 1 to MAX",
                hint="e.g. --nodes 2-4: start on 4 nodes, continue on as few as 2",
            )
        if self.spare_nodes < 0:
            raise ConfigError(
                f"--spare-nodes {self.spare_nodes}: a negative number of spare nodes", hint="use 0 or more spare nodes"
            )
        if self.heals and self.sweep:
            raise ConfigError(
                "--spare-nodes / --nodes MIN-MAX with a sweep: each array task is its own job",
                hint="leave them out of trainscale sweep",
            )
        if self.chain < 1 or self.max_requeues < 0:
            raise ConfigError(
                f"--chain {self.chain} / --max-requeues {self.max_requeues}: need a chain of 1 job or "
                "more and 0 requeues or more",
                hint="e.g. --chain 3 --max-requeues 2",
            )
        if self.sweep and (self.chain > 1 or not self.array):
            raise ConfigError("a sweep is one array job (not a chain)", hint="use trainscale sweep --grid ...")
        if self.chain > 1 and (self.array or self.dependency):
            raise ConfigError(
                "--chain with --array/--dependency: a chain makes its own dependencies",
                hint="drop --dependency (the first link can wait with `trainscale slurm ... --submit` "
                "later), or use `trainscale sweep` for arrays",
            )
        if self.dataloader_workers < 0:
            raise ConfigError(f"dataloader_workers={self.dataloader_workers} is negative", hint="use 0 or more")
        for line in self.extra_sbatch:
            if not line.strip().startswith("-"):
                raise ConfigError(
                    f"extra sbatch option {line!r} is not an option",
                    hint="write it as on the sbatch command line, e.g. --constraint=a100",
                )
        if self.gpu_visibility not in GPU_VISIBILITY:
            raise ConfigError(
                f"--gpu-visibility {self.gpu_visibility!r} unknown",
                hint=did_you_mean(self.gpu_visibility, GPU_VISIBILITY),
            )
        if self.container_mode is not None and self.container_mode not in CONTAINER_MODES:
            raise ConfigError(
                f"container mode {self.container_mode!r} unknown",
                hint="use exec (run the command in the image) or run (through the image's runscript)",
            )
        if not self.container and (self.container_mode or self.container_setup or self.binds):
            raise ConfigError(
                "--container-run/--container-setup/--bind given without --container IMAGE",
                hint="add --container /path/to/image.sif, or drop the container options",
            )
        for bind in self.binds:
            if not bind or bind.startswith(":") or "," in bind:
                raise ConfigError(
                    f"--bind {bind!r} is not SRC[:DST[:OPTS]]",
                    hint="one path per --bind, e.g. --bind /scratch/project_465000000 or "
                    "--bind env.sqsh:/user-software:image-src=/",
                )
        if self.array is not None and not _ARRAY.match(self.array):
            raise ConfigError(
                f"--array {self.array!r} is not an sbatch array",
                hint="e.g. --array 0-7, --array 1,3,5 or --array 0-15%4 (at most 4 at once)",
            )
        if self.mail_type is not None:
            bad = [t for t in self.mail_type.upper().split(",") if t not in MAIL_TYPES]
            if bad:
                raise ConfigError(
                    f"--mail-type {self.mail_type!r}: {', '.join(bad)} unknown",
                    hint=f"use a comma list of {', '.join(MAIL_TYPES)}",
                )
        for name in ("dependency", "export", "qos", "constraint", "gpu_type", "gpu_bind", "chdir", "output", "error"):
            value = getattr(self, name)
            if value is not None and (not value.strip() or any(c in value for c in "\n\r")):
                raise ConfigError(
                    f"--{name.replace('_', '-')} {value!r} is empty or spans lines",
                    hint="give one value, as on the sbatch command line",
                )

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
    """Per local rank, the cores from the profile's map (empty when the profile has no map or the node is shared)."""
    output_dir: Path
    time_s: int
    partial_node: bool = False
    """Fewer GPUs than the node has and not --exclusive: SLURM may hand out any of its GPUs and cores."""
    task_gpu: str = ""
    """srun mode: how each task is given only its own GPU: a visibility variable (CUDA_VISIBLE_DEVICES or
    ROCR_VISIBLE_DEVICES, set per task by the bootstrap), ``slurm`` (``srun --gpus-per-task=1``), or ""."""
    gpu_visibility_reason: str = ""
    """Why every task sees all the node's GPUs (``auto`` found the script picks its GPU by rank index)."""
    facts: ScriptFacts = field(default_factory=ScriptFacts)
    """What the script's source shows (imports trainscale, GPU by index)."""
    run_dir: Path = Path("trainscale-jobs/run")
    """The submission's run directory (launch/slurm/layout.py)."""
    code_root: Path | None = None
    """The directory the job's code is snapshotted from (launch/slurm/snapshot.py); None: nothing is copied."""

    @property
    def world_size(self) -> int:
        return self.ranks_per_node * self.nodes


def usable_cpus(profile: ClusterProfile) -> int:
    return max(1, profile.cpus_per_node - len(profile.reserved_cores))


def binding_plan(profile: ClusterProfile, ranks: int) -> tuple[tuple[int, ...], ...]:
    """Per local rank, the cores the profile's map gives it (GPU-local first, reserved excluded); () without a map."""
    if profile.binding != "map" or (profile.gpus_per_node and ranks > profile.gpus_per_node):
        return ()  # more ranks than GPUs: lint reports it
    from trainscale.profiles import binding_plan as plan_for  # noqa: PLC0415 (CLI start-up)

    plan = plan_for(profile, ranks)
    return tuple(r.cpus for r in plan.ranks) if plan else ()


def ranks_per_node(spec: SlurmJobSpec, profile: ClusterProfile) -> int:
    if spec.gpus_per_node:
        return spec.gpus_per_node
    if spec.ntasks:
        return max(1, spec.ntasks // spec.nodes)
    return profile.gpus_per_node or 1


def _task_gpu(spec: SlurmJobSpec, profile: ClusterProfile, launcher: str, facts: ScriptFacts) -> tuple[str, str]:
    """(how each srun task gets only its own GPU, or ""; why not, when auto decided against it)."""
    if launcher != "srun" or not profile.gpus_per_node or spec.gpu_bind or profile.task_gpu == "none":
        return "", ""
    if spec.gpu_visibility == "node":
        return "", ""
    if spec.gpu_visibility == "auto" and facts.gpu_index_line is not None:
        return "", (
            f"{Path(facts.path or '').name} line {facts.gpu_index_line} picks its GPU by rank index "
            f"({facts.gpu_index_code}): every task sees all the node's GPUs"
        )
    if profile.task_gpu == "slurm":
        return "slurm", ""
    return ("ROCR_VISIBLE_DEVICES" if profile.gpu_vendor == "amd" else "CUDA_VISIBLE_DEVICES"), ""


def resolve(spec: SlurmJobSpec, profile: ClusterProfile, facts: ScriptFacts | None = None) -> JobPlan:
    """Derive the plan; consistency problems are left for :func:`~trainscale.launch.slurm.lint.lint`.

    ``facts`` about the script are read from its source when not given (never run).
    """
    facts = facts if facts is not None else script_facts(spec.script, spec.module, spec.workload)
    launcher = spec.launcher or profile.default_launcher
    gpu = profile.gpus_per_node > 0
    ranks = ranks_per_node(spec, profile)
    # Fewer GPUs than the node has and no --exclusive: SLURM picks which GPUs and cores (LUMI's small-g
    # may hand out GCDs 4-7), so the profile's fixed masks for GCDs 0..n-1 could be the wrong ones.
    partial = gpu and ranks < profile.gpus_per_node and not spec.exclusive
    rank_cpus = () if partial else binding_plan(profile, ranks)
    tasks = spec.tasks_per_node or (1 if launcher == "torchrun" else ranks)
    if spec.cpus_per_gpu:
        per_rank = spec.cpus_per_gpu
    elif spec.cpus_per_task:
        per_rank = max(1, spec.cpus_per_task * tasks // ranks)
    elif rank_cpus and all(rank_cpus):
        per_rank = min(len(c) for c in rank_cpus)
    elif profile.binding == "map" and gpu and profile.gpu_cores:
        per_rank = min(
            len([c for c in cores if c not in profile.reserved_cores]) for cores in profile.gpu_cores.values()
        )
    elif gpu:  # a GPU's share of the node, whatever number of GPUs the job asks for
        per_rank = max(1, usable_cpus(profile) // max(profile.gpus_per_node, ranks))
    else:
        per_rank = max(1, usable_cpus(profile) // ranks)
    if spec.cpus_per_gpu and not spec.cpus_per_task:
        cpus_per_task = None  # --cpus-per-gpu already says it; do not bind the same CPUs twice
    else:
        cpus_per_task = spec.cpus_per_task or per_rank * ranks // tasks
    mem_per_gpu = spec.mem_per_gpu or (f"{profile.mem_per_gpu_gb:g}G" if profile.mem_per_gpu_gb else None)
    mem_per_node = None
    if spec.mem:
        mem_per_gpu, mem_per_node = None, spec.mem
    elif mem_per_gpu and not gpu:  # CPU-only: memory per rank, asked for per node
        mem_per_node = f"{parse_mem_gb(mem_per_gpu) * ranks:g}G"
        mem_per_gpu = None
    task_gpu, why = _task_gpu(spec, profile, launcher, facts)
    return JobPlan(
        launcher=launcher,
        nodes=spec.nodes,
        ranks_per_node=ranks,
        tasks_per_node=tasks,
        cpus_per_task=cpus_per_task,
        cpus_per_rank=per_rank,
        gpus_per_node=ranks if gpu else 0,
        partition=spec.partition or profile.default_partition,
        mem_per_gpu=mem_per_gpu,
        mem_per_node=mem_per_node,
        rank_cpus=rank_cpus,
        output_dir=Path(spec.output_dir).absolute(),
        time_s=parse_time(spec.time),
        partial_node=partial,
        task_gpu=task_gpu,
        gpu_visibility_reason=why,
        facts=facts,
        run_dir=Path(spec.output_dir).absolute() / (spec.run_name or f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}"),
        code_root=code_root_for(spec.script, spec.module, spec.snapshot, facts),
    )
