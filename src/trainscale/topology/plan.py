"""Plan which CPUs each local rank gets: GPU-local cores first, reserved cores never. Pure: nothing is applied here."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from trainscale.errors import ConfigError
from trainscale.topology.cpulist import cores_to_mask, format_cpulist, parse_cpulist
from trainscale.topology.model import Topology


@dataclass(frozen=True, kw_only=True)
class RankBinding:
    """The CPU set planned for one local rank."""

    local_rank: int
    """Rank within the node."""
    gpu: int | None
    """Node-local GPU index this rank drives; None for CPU-only ranks."""
    cpus: tuple[int, ...]
    """Cores this rank is bound to, sorted."""

    @property
    def cpulist(self) -> str:
        return format_cpulist(self.cpus)

    @property
    def mask(self) -> str:
        return cores_to_mask(self.cpus)


@dataclass(frozen=True, kw_only=True)
class BindingPlan:
    """One CPU set per local rank, and why it looks the way it does."""

    ranks: tuple[RankBinding, ...]
    """Indexed by local rank."""
    source: str
    """Where the core sets came from, in words (``profile lumi map``, ``detected topology``...)."""
    shared: bool = False
    """True when there were fewer cores than ranks, so some ranks share cores."""

    def __post_init__(self) -> None:
        if [r.local_rank for r in self.ranks] != list(range(len(self.ranks))):
            raise ConfigError("a binding plan must list local ranks 0..N-1 in order")

    @property
    def local_world_size(self) -> int:
        return len(self.ranks)

    def mask_list(self) -> str:
        """``0xfe000000000000,0xfe00000000000000,...``: one mask per local rank, in rank order."""
        return ",".join(r.mask for r in self.ranks)

    def cpu_bind_option(self) -> str:
        """The srun option that applies this plan: ``--cpu-bind=mask_cpu:0x..,0x..``."""
        return f"--cpu-bind=mask_cpu:{self.mask_list()}"

    def to_env(self) -> str:
        """Compact form for an environment variable: ``GPU:cores`` per rank, ``/``-separated (``-`` for no GPU)."""
        return "/".join(f"{'-' if r.gpu is None else r.gpu}:{r.cpulist}" for r in self.ranks)

    @classmethod
    def from_env(cls, text: str, *, source: str = "environment") -> BindingPlan:
        ranks = []
        if ":" not in text and ";" in text:  # bare cpulists per rank, ';'-separated: CPU-only ranks
            text = "/".join(f"-:{p}" for p in text.split(";"))
        for i, part in enumerate(p for p in text.strip().split("/") if p):
            gpu, sep, cores = part.partition(":")
            if not sep or not (gpu == "-" or gpu.isdigit()):
                raise ConfigError(
                    f"cannot read binding plan {text!r} at {part!r}",
                    hint="expected GPU:cores per rank separated by '/', e.g. 0:49-55/1:57-63",
                )
            ranks.append(RankBinding(local_rank=i, gpu=None if gpu == "-" else int(gpu), cpus=parse_cpulist(cores)))
        if not ranks:
            raise ConfigError(f"binding plan {text!r} names no ranks", hint="e.g. 0:49-55/1:57-63")
        return cls(ranks=tuple(ranks), source=source)

    def describe(self) -> list[str]:
        lines = [f"{'LOCAL RANK':<11} {'GPU':<4} {'CORES':<24} MASK_CPU"]
        for r in self.ranks:
            gpu = "-" if r.gpu is None else str(r.gpu)
            lines.append(f"{r.local_rank:<11} {gpu:<4} {r.cpulist:<24} {r.mask}")
        return lines


def _split(cores: tuple[int, ...], parts: int, core_of: Mapping[int, int]) -> tuple[list[tuple[int, ...]], bool]:
    """Split cores into ``parts`` contiguous, near-equal pieces, keeping SMT siblings of one core together.

    Returns the pieces and whether any had to be shared (fewer cores than parts).
    """
    groups: dict[int, list[int]] = {}
    for cpu in cores:
        groups.setdefault(core_of.get(cpu, cpu), []).append(cpu)
    physical = [tuple(groups[key]) for key in sorted(groups)]
    units: list[tuple[int, ...]] = physical if len(physical) >= parts else [(c,) for c in cores]
    if len(units) < parts:  # too few CPUs even counting SMT threads: ranks share, round-robin
        return [units[i % len(units)] for i in range(parts)], True
    base, extra = divmod(len(units), parts)
    pieces, start = [], 0
    for i in range(parts):
        size = base + (1 if i < extra else 0)
        pieces.append(tuple(sorted(c for unit in units[start : start + size] for c in unit)))
        start += size
    return pieces, False


def plan_cpu_only(
    usable: Iterable[int],
    local_world_size: int,
    *,
    reserved: Iterable[int] = (),
    core_of: Mapping[int, int] | None = None,
    source: str = "even split of usable cores",
) -> BindingPlan:
    """No GPUs: split the usable cores (minus reserved) evenly, in contiguous blocks, among the local ranks."""
    _check_ranks(local_world_size)
    skip = _with_siblings(reserved, core_of or {})
    cores = tuple(c for c in parse_cpulist(usable) if c not in skip)
    if not cores:
        raise ConfigError(
            "no usable cores left to bind after removing the reserved ones",
            hint="check cpus_per_node and reserved_cores",
        )
    pieces, shared = _split(cores, local_world_size, core_of or {})
    ranks = tuple(RankBinding(local_rank=i, gpu=None, cpus=p) for i, p in enumerate(pieces))
    return BindingPlan(ranks=ranks, source=source, shared=shared)


def visible_gpus(environ: Mapping[str, str], node_gpus: Iterable[int]) -> tuple[int, ...] | None:
    """Node-local indices (as nvidia-smi / rocm-smi number them) of the GPUs this process sees, in the
    order torch numbers them: with ``CUDA_VISIBLE_DEVICES=4,5,6,7``, cuda:0 is the node's GPU 4.

    ROCm applies ``ROCR_VISIBLE_DEVICES`` first, then ``HIP_VISIBLE_DEVICES`` (or
    ``CUDA_VISIBLE_DEVICES``) to what is left. A list stops at its first index that does not exist,
    as CUDA's does. None: no variable narrows the GPUs, or one names them by UUID or MIG instance,
    which the topology tools' indices cannot be matched to.
    """
    order = sorted(node_gpus)
    narrowed = False
    second = "HIP_VISIBLE_DEVICES" if environ.get("HIP_VISIBLE_DEVICES") is not None else "CUDA_VISIBLE_DEVICES"
    for name in ("ROCR_VISIBLE_DEVICES", second):
        value = environ.get(name)
        if value is None:
            continue
        narrowed = True
        picked: list[int] = []
        for entry in (e.strip() for e in value.split(",") if e.strip()):
            if not entry.isdigit():
                if entry.startswith("-"):  # "-1": nothing visible from here on
                    break
                return None  # GPU-<uuid>, MIG-<uuid>: not an index
            if int(entry) >= len(order):
                break
            picked.append(order[int(entry)])
        order = picked
    return tuple(order) if narrowed else None


def node_gpu_indices(query: str, gpus: Iterable[Mapping[str, str | None]]) -> tuple[list[int], list[str]]:
    """Node-local indices (nvidia-smi's, those of ``nvidia-smi topo -m``) of ``gpus``, and the GPUs that
    ``nvidia-smi --query-gpu=index,pci.bus_id,uuid --format=csv,noheader`` (``query``) does not list.

    Each GPU is named as torch knows it (``{"pci": "0000:87:00.0", "uuid": ...}``, observe/devices.py's
    ``identity``): unlike a torch index, a PCI address or UUID names the same GPU in every process, whatever
    ``CUDA_VISIBLE_DEVICES`` or a per-task cgroup renumbered (with ``4,5,6,7`` cuda:0 is GPU 4; with srun's
    one GPU per task every rank drives a cuda:0). Lines that do not start with an index are skipped.
    """
    index_of: dict[str, int] = {}
    for line in query.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) >= 2 and fields[0].isdigit():
            index_of[_pci(fields[1])] = int(fields[0])
            if len(fields) > 2 and fields[2]:
                index_of[_uuid(fields[2])] = int(fields[0])
    found: set[int] = set()
    missing: list[str] = []
    for gpu in gpus:
        keys = [_pci(gpu["pci"])] if gpu.get("pci") else []
        keys += [_uuid(gpu["uuid"])] if gpu.get("uuid") else []
        index = next((index_of[k] for k in keys if k in index_of), None)
        if index is None:
            missing.append(str(gpu.get("pci") or gpu.get("uuid")))
        else:
            found.add(index)
    return sorted(found), missing


def _pci(address: str) -> str:
    """``00000000:87:00.0`` (nvidia-smi) and ``0000:87:00.0`` (torch) alike -> ``0000:87:00.0``."""
    domain, bus, rest = address.strip().lower().split(":")
    device, _, function = rest.partition(".")
    return f"{int(domain, 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function or '0'}"


def _uuid(uuid: str) -> str:
    return uuid.strip().lower().removeprefix("gpu-")


def gpu_order(
    visible: Sequence[int] | None, node_gpus: Iterable[int], local_rank: int, local_world_size: int
) -> list[int]:
    """The node-local GPU each local rank drives, in local-rank order (what :func:`plan_binding` maps).

    Local rank r drives torch's cuda:r, the r-th *visible* GPU. When this process sees a single GPU
    while its node runs several ranks (SLURM's one GPU per task), only this rank's GPU is known: the
    other ranks are taken to drive the remaining GPUs in index order.
    """
    gpus = sorted(node_gpus)
    if visible is None:
        return gpus
    if len(visible) == 1 and local_world_size > 1:
        rest = [g for g in gpus if g != visible[0]]
        return rest[:local_rank] + [visible[0]] + rest[local_rank:]
    return list(visible)


def plan_binding(
    gpu_cores: Mapping[int, Iterable[int]] | Topology,
    local_world_size: int,
    *,
    reserved: Iterable[int] = (),
    cpus_per_node: int | None = None,
    core_of: Mapping[int, int] | None = None,
    source: str | None = None,
    gpu_order: Sequence[int] | None = None,
) -> BindingPlan:
    """Local rank i drives GPU ``gpu_order[i]`` (default: the i-th GPU of the node) and gets the cores
    close to that GPU, minus ``reserved``.

    ``gpu_order`` matters when ``*_VISIBLE_DEVICES`` narrows the GPUs: rank i then drives the i-th
    *visible* one (see :func:`visible_gpus` and :func:`gpu_order`). ``gpu_cores`` is a profile's
    GPU -> cores map or a detected :class:`Topology`. When several ranks' GPUs share the same close
    cores (two GPUs per NUMA node), those cores are split among them so ranks never overlap. Without
    GPUs the plan splits the node's cores evenly (:func:`plan_cpu_only`), taking them from the
    topology or from ``range(cpus_per_node)``.
    """
    _check_ranks(local_world_size)
    all_cpus: tuple[int, ...] = ()
    if isinstance(gpu_cores, Topology):
        topology = gpu_cores
        core_of = topology.core_of if core_of is None else core_of
        all_cpus = topology.cpus
        source = source or "detected topology"
        gpu_cores = topology.gpu_cores()
    core_of = core_of or {}
    skip = _with_siblings(reserved, core_of)
    if not gpu_cores:
        usable = all_cpus or (tuple(range(cpus_per_node)) if cpus_per_node else ())
        if not usable:
            raise ConfigError(
                "cannot plan a CPU-only binding without knowing the node's CPUs",
                hint="give cpus_per_node or a detected topology",
            )
        return plan_cpu_only(
            usable, local_world_size, reserved=skip, core_of=core_of, source=source or "even split of usable cores"
        )
    gpus = list(gpu_order) if gpu_order is not None else sorted(gpu_cores)
    unknown = [g for g in gpus if g not in gpu_cores]
    if unknown:
        raise ConfigError(
            f"GPU(s) {', '.join(map(str, unknown))} are visible to this process but not in the "
            f"node's topology (GPUs {', '.join(map(str, sorted(gpu_cores)))})",
            hint="check CUDA_VISIBLE_DEVICES/ROCR_VISIBLE_DEVICES against `nvidia-smi topo -m` "
            "or `rocm-smi`, or plan from a profile's GPU map",
        )
    if local_world_size > len(gpus):
        what = "GPU(s) visible" if gpu_order is not None else "GPU(s)"
        raise ConfigError(
            f"{local_world_size} local ranks but the node has {len(gpus)} {what}",
            hint=f"run at most {len(gpus)} rank(s) per node, one per GPU",
        )
    # Ranks whose GPUs are close to the same cores share them out between themselves.
    by_set: dict[tuple[int, ...], list[int]] = {}
    for rank in range(local_world_size):
        close = tuple(c for c in parse_cpulist(gpu_cores[gpus[rank]]) if c not in skip)
        if not close:
            raise ConfigError(
                f"GPU {gpus[rank]} has no close cores left after removing reserved cores",
                hint="check the profile's gpu_cores and reserved_cores",
            )
        by_set.setdefault(close, []).append(rank)
    cpus: dict[int, tuple[int, ...]] = {}
    shared = False
    for close, ranks in by_set.items():
        pieces, was_shared = _split(close, len(ranks), core_of)
        shared = shared or was_shared
        cpus.update(zip(ranks, pieces))
    bindings = tuple(RankBinding(local_rank=r, gpu=gpus[r], cpus=cpus[r]) for r in range(local_world_size))
    return BindingPlan(ranks=bindings, source=source or "GPU -> cores map", shared=shared)


def _with_siblings(reserved: Iterable[int], core_of: Mapping[int, int]) -> set[int]:
    """A reserved core takes its SMT siblings with it: the system owns the whole physical core."""
    physical = {core_of.get(c, c) for c in reserved}
    return set(reserved) | {cpu for cpu, core in core_of.items() if core in physical}


def _check_ranks(local_world_size: int) -> None:
    if local_world_size < 1:
        raise ConfigError(f"local world size {local_world_size} must be at least 1", hint="e.g. --ranks 8")
