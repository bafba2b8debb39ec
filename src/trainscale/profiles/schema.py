"""What a cluster profile holds. Profiles are data (TOML files); this is their typed, validated form."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from trainscale.errors import ConfigError

LAUNCHERS = ("torchrun", "srun")
CONTAINER_RUNTIMES = ("singularity", "apptainer", "pyxis")
TASK_GPU = ("env", "slurm", "none")
GPU_VENDORS = ("nvidia", "amd", "none")
BINDINGS = ("map", "topology", "none")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


@dataclass(frozen=True, kw_only=True)
class ContainerSpec:
    """How to wrap the training command in a container on this cluster."""

    runtime: str = "singularity"
    """singularity or apptainer (a name on PATH or a full path to one), or pyxis (``srun --container-image``,
    NVIDIA's enroot plugin)."""
    binds: tuple[str, ...] = ()
    """Paths bound into the container (``-B`` arguments, pyxis: ``--container-mounts``), e.g. ``/scratch``."""
    flags: tuple[str, ...] = ()
    """Extra flags for ``exec``/``run`` (``--nv`` on NVIDIA, ``--rocm`` on AMD)."""
    mode: str = "exec"
    """exec (run the command in the image) or run (through the image's runscript, which sets up its environment)."""
    setup: tuple[str, ...] = ()
    """Shell lines run inside the container before Python, e.g. ``$WITH_CONDA`` for LUMI's older images."""
    modules: tuple[str, ...] | None = None
    """Module lines a container job loads *instead of* the profile's ``modules`` (a stock image brings its own
    software stack: LUMI's jobs load only ``singularity-AI-bindings``); None: the profile's ``modules``."""

    def __post_init__(self) -> None:
        name = self.runtime.rstrip("/").rsplit("/", 1)[-1]
        if name not in CONTAINER_RUNTIMES or (name == "pyxis" and "/" in self.runtime):
            raise ConfigError(
                f"container runtime {self.runtime!r} is not supported",
                hint='use runtime = "singularity" or "apptainer" (or a full path to one), or "pyxis"',
            )
        if self.mode not in ("exec", "run"):
            raise ConfigError(f"container mode {self.mode!r} unknown", hint='use mode = "exec" or "run"')

    @property
    def kind(self) -> str:
        """singularity, apptainer or pyxis, whatever the spelling of ``runtime``."""
        return self.runtime.rstrip("/").rsplit("/", 1)[-1]


@dataclass(frozen=True, kw_only=True)
class ClusterProfile:
    """One cluster's facts and habits: partitions, node shape, binding, modules, container, environment."""

    name: str
    """Short name used with ``--profile``."""
    description: str = ""
    """One line shown by ``trainscale profiles``."""
    partitions: tuple[str, ...] = ()
    """Partitions users may pick; the first is the default. Empty: let SLURM choose."""
    gpus_per_node: int = 0
    """GPUs (or GCDs) per node; 0 for CPU-only nodes."""
    gpu_vendor: str = "none"
    """nvidia, amd or none: picks the backend (nccl/rccl vs gloo) and the topology tool."""
    cpus_per_node: int = 1
    """Hardware threads SLURM may hand out per node."""
    reserved_cores: tuple[int, ...] = ()
    """Cores the system keeps for itself (LUMI's first core of each CCD); never bound to ranks."""
    mem_per_node_gb: float = 0.0
    """Memory a job may ask for per node, in GB (0: unknown, not checked)."""
    mem_per_gpu_gb: float = 0.0
    """Default memory per GPU, in GB (the seeds use 60 GB per GPU on LUMI)."""
    binding: str = "none"
    """map (use gpu_cores below), topology (detect on the node at run time) or none."""
    gpu_cores: dict[int, tuple[int, ...]] = field(default_factory=dict)
    """For binding = map: local GPU index -> the cores closest to it."""
    forbid_cpus_per_gpu: bool = False
    """True where ``--cpus-per-gpu`` breaks GPU-to-GPU communication (LUMI)."""
    requires_account: bool = False
    """True where every job must name a project/account."""
    default_launcher: str = "torchrun"
    """torchrun (one task per node) or srun (one task per GPU)."""
    max_time: str = ""
    """The partition's time limit, ``D-HH:MM:SS`` or ``HH:MM:SS``; empty: not checked."""
    modules: tuple[str, ...] = ()
    """Module lines run before training, e.g. ``module load LUMI/25.03 partition/G`` (with ``set -u`` off: Lmod
    needs it). A job drops them with ``--no-profile-modules``; a container job loads ``container.modules`` instead
    when the profile has that key."""
    modules_checked: str = ""
    """When the module lines were last checked against the site's documentation, ``YYYY-MM-DD`` ("" unknown)."""
    setup: tuple[str, ...] = ()
    """Shell lines run in the batch script after the modules and environment, before launch."""
    task_gpu: str = "env"
    """srun mode, one GPU per task: env (the bootstrap narrows CUDA_/ROCR_VISIBLE_DEVICES to the task's GPU),
    slurm (``srun --gpus-per-task=1``; where SLURM constrains devices with cgroups this cuts P2P/CUDA IPC
    between the node's ranks, so only for sites without ConstrainDevices) or none."""
    extends: str = ""
    """The profile this one was derived from (``extends = "lumi"``), for display."""
    interconnect: str = ""
    """The fast network NCCL/RCCL should use between nodes: ofi (libfabric: aws-ofi-rccl/-nccl), ib, socket;
    empty: not checked. A multi-node job found on sockets instead is named (observe/interconnect.py)."""
    interconnect_required: bool = False
    """True: such a job stops at its start with the fix instead of only warning."""
    shares_cores: bool = False
    """All nodes are one machine's cores (the local test cluster): a scaling study's achievable ideal
    counts them once."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables exported in the batch script (NCCL/RCCL settings, ...)."""
    container: ContainerSpec | None = None
    """How to run inside a container when ``--container IMAGE`` is given."""

    def __post_init__(self) -> None:
        if self.gpu_vendor not in GPU_VENDORS:
            raise ConfigError(
                f"profile {self.name}: gpu_vendor {self.gpu_vendor!r} unknown", hint=f"one of {', '.join(GPU_VENDORS)}"
            )
        if self.binding not in BINDINGS:
            raise ConfigError(
                f"profile {self.name}: binding {self.binding!r} unknown", hint=f"one of {', '.join(BINDINGS)}"
            )
        if self.default_launcher not in LAUNCHERS:
            raise ConfigError(
                f"profile {self.name}: default_launcher {self.default_launcher!r} unknown",
                hint=f"one of {', '.join(LAUNCHERS)}",
            )
        if self.interconnect not in ("", "ofi", "ib", "socket"):
            raise ConfigError(
                f"profile {self.name}: interconnect {self.interconnect!r} unknown",
                hint="one of ofi (libfabric), ib, socket, or leave it out",
            )
        if self.task_gpu not in TASK_GPU:
            raise ConfigError(
                f"profile {self.name}: task_gpu {self.task_gpu!r} unknown", hint=f"one of {', '.join(TASK_GPU)}"
            )
        if self.modules_checked and not _DATE.match(self.modules_checked):
            raise ConfigError(
                f"profile {self.name}: modules_checked = {self.modules_checked!r} is not a date",
                hint='write the day the module lines were checked as YYYY-MM-DD, e.g. "2026-11-24"',
            )
        if self.gpus_per_node < 0 or self.cpus_per_node < 1:
            raise ConfigError(f"profile {self.name}: gpus_per_node must be >= 0 and cpus_per_node >= 1")
        if self.binding == "map":
            missing = [g for g in range(self.gpus_per_node) if g not in self.gpu_cores]
            if missing:
                raise ConfigError(
                    f'profile {self.name}: binding = "map" but gpu_cores has no entry for GPU(s) {missing}',
                    hint='give one core list per GPU, e.g. gpu_cores = { 0 = "49-55" }',
                )

    @property
    def default_partition(self) -> str | None:
        return self.partitions[0] if self.partitions else None

    @property
    def backend(self) -> str:
        return "gloo" if self.gpu_vendor == "none" else "nccl"
