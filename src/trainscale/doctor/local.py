"""Checks of this process's own view: versions, devices, launch environment, binding, threads.

Each ``collect_*`` is pure: it takes the facts (read by facts.py, or made up by a test) and returns Findings.
"""

from __future__ import annotations

from collections.abc import Mapping

from trainscale.doctor.facts import Devices, Versions
from trainscale.doctor.finding import BINDING, DEVICES, LAUNCH, THREADS, VERSIONS, Finding, error, ok, warning
from trainscale.env import LaunchEnv, detect
from trainscale.errors import TrainscaleError
from trainscale.topology import PLAN_ENV, Topology, far_from_gpu, format_cpulist, plan_binding, plan_from_env
from trainscale.topology.plan import gpu_order, visible_gpus

# Variables worth showing in a bug report when they are set.
SHOWN_VARS = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "TORCHELASTIC_RESTART_COUNT",
    "SLURM_JOB_ID",
    "SLURM_STEP_ID",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_NNODES",
    "SLURM_CPUS_PER_TASK",
    "SLURM_CPU_BIND",
    "OMPI_COMM_WORLD_RANK",
    "PMI_RANK",
    "NCCL_SOCKET_IFNAME",
    "GLOO_SOCKET_IFNAME",
    "NCCL_DEBUG",
    "NCCL_IB_HCA",
    "OMP_NUM_THREADS",
    "TRAINSCALE_LAUNCHER",
    PLAN_ENV,
)


def collect_versions(v: Versions) -> list[Finding]:
    found = [
        ok(VERSIONS, "trainscale", v.trainscale),
        ok(VERSIONS, "python", f"{v.python} at {v.executable}"),
        ok(VERSIONS, "platform", v.platform),
    ]
    packages = [ok(VERSIONS, name, version or "not installed", version=version) for name, version in v.packages.items()]
    if v.torch is None:
        found.append(
            error(
                VERSIONS,
                "torch",
                f"cannot import torch: {v.torch_error}",
                "install PyTorch into this environment (https://pytorch.org/get-started/locally/)",
            )
        )
        return found + packages
    build = f"CUDA {v.cuda}" if v.cuda else f"ROCm/HIP {v.hip}" if v.hip else "CPU-only build"
    found.append(ok(VERSIONS, "torch", f"{v.torch} ({build})", torch=v.torch, cuda=v.cuda, hip=v.hip))
    if v.cuda or v.hip:
        name = "RCCL" if v.hip else "NCCL"
        if v.nccl:
            found.append(ok(VERSIONS, name.lower(), f"{name} {v.nccl}", version=v.nccl))
        else:
            found.append(
                warning(
                    VERSIONS,
                    name.lower(),
                    f"{name} version could not be read",
                    "no GPU is visible, or torch was built without it; the nccl backend may not work",
                )
            )
    else:
        found.append(ok(VERSIONS, "nccl", "not applicable (no CUDA/ROCm in this torch build)"))
    if v.backends:
        found.append(ok(VERSIONS, "backends", "torch.distributed backends: " + ", ".join(v.backends)))
    else:
        found.append(
            error(
                VERSIONS,
                "backends",
                "torch.distributed has no backend (gloo, nccl, mpi all missing)",
                "install a PyTorch build with distributed support (the official wheels have it)",
            )
        )
    return found + packages


def collect_devices(d: Devices, v: Versions) -> list[Finding]:
    topo = d.topology
    found: list[Finding] = []
    if d.names:
        listed = "; ".join(f"{i}: {n} ({m} GiB)" for i, (n, m) in enumerate(zip(d.names, d.memory_gib)))
        found.append(
            ok(
                DEVICES,
                "accelerators",
                f"{len(d.names)} {d.accelerator.upper()} device(s): {listed}",
                count=len(d.names),
            )
        )
    elif topo.gpus:
        if not (v.cuda or v.hip):
            hint = "this torch is a CPU-only build: install the CUDA or ROCm build of torch that matches the driver"
        elif any(d.visible.get(k, None) in ("", "-1", "none") for k in d.visible):
            hint = f"{', '.join(f'{k}={val!r}' for k, val in d.visible.items())} hides them: unset it or list GPUs"
        else:
            hint = "check the driver with nvidia-smi / rocm-smi, and that the job asked for GPUs (--gpus-per-node)"
        found.append(
            warning(
                DEVICES,
                "accelerators",
                f"the node has {len(topo.gpus)} GPU(s) but torch sees none" + (f" ({d.error})" if d.error else ""),
                hint,
                count=0,
            )
        )
    else:
        found.append(ok(DEVICES, "accelerators", "no GPU: training runs on CPU with the gloo backend", count=0))
    if d.visible:
        found.append(ok(DEVICES, "visible devices", ", ".join(f"{k}={val}" for k, val in d.visible.items())))
    found.append(ok(DEVICES, "topology", "\n".join(topo.describe()), sources=list(topo.sources)))
    found.append(ok(DEVICES, "topology sources", "; ".join(topo.sources) or "nothing could be read"))
    return found


def collect_launch(environ: Mapping[str, str]) -> tuple[list[Finding], LaunchEnv | None]:
    """The launch environment as trainscale.env.detect() sees it, and the variables behind it."""
    shown = ", ".join(f"{k}={environ[k]}" for k in SHOWN_VARS if k in environ)
    variables = ok(LAUNCH, "variables", shown or "none of the launcher variables are set")
    try:
        env = detect(environ)
    except TrainscaleError as exc:
        return [error(LAUNCH, "detected", exc.message, exc.hint or "check the launcher's variables"), variables], None
    where = (
        f"{env.source}: rank {env.rank}/{env.world_size}, local rank {env.local_rank}/{env.local_world_size}, "
        f"node {env.node_rank}/{env.num_nodes}"
    )
    if env.master_addr:
        where += f", master {env.master_addr}:{env.master_port}"
    if env.job_id:
        where += f", job {env.job_id}"
    if env.restart_count:
        where += f", restart {env.restart_count}"
    hint = ""
    if env.source == "single" and env.slurm_job_id:
        hint = (
            "this is the batch script of SLURM job, not an srun task: run `srun python -m trainscale.doctor "
            "--network` to check every task"
        )
    found = ok(
        LAUNCH,
        "detected",
        where,
        hint,
        source=env.source,
        rank=env.rank,
        world_size=env.world_size,
        local_rank=env.local_rank,
        local_world_size=env.local_world_size,
    )
    return [found, variables], env


def collect_binding(
    env: LaunchEnv | None, topology: Topology, affinity: frozenset[int], environ: Mapping[str, str]
) -> list[Finding]:
    lws, local_rank = (env.local_world_size, env.local_rank) if env else (1, 0)
    numa = sorted({n for n in (topology.numa_of(c) for c in affinity) if n is not None})
    actual = f"{format_cpulist(sorted(affinity))} ({len(affinity)} CPU(s)" + (
        f", NUMA node(s) {', '.join(map(str, numa))})" if numa else ")"
    )
    found = [ok(BINDING, "affinity", f"local rank {local_rank} may run on CPUs {actual}", cpus=sorted(affinity))]
    value = environ.get(PLAN_ENV, "").strip()
    requested = value not in ("", "none")
    try:  # the plan TRAINSCALE_CPU_BIND asks for, else the one trainscale would make
        if requested:
            plan = plan_from_env(value, lws, detect=lambda: topology, environ=environ, local_rank=local_rank)
        else:
            node = [g.index for g in topology.gpus]
            order = gpu_order(visible_gpus(environ, node), node, local_rank, lws) if node else None
            plan = plan_binding(topology, lws, gpu_order=order)
    except TrainscaleError as exc:
        if requested:
            found.append(
                warning(
                    BINDING,
                    "plan",
                    f"{PLAN_ENV}={environ.get(PLAN_ENV)!r} cannot be used: {exc.message}",
                    "run `trainscale profiles --here` to see a plan that fits this node, or unset it",
                )
            )
        else:
            found.append(ok(BINDING, "plan", f"trainscale cannot plan a binding here: {exc.message}"))
        return found
    mine = plan.ranks[local_rank] if local_rank < plan.local_world_size else None
    planned = set(mine.cpus) if mine else set()
    if not requested:
        found.append(
            ok(
                BINDING,
                "plan",
                f"no binding requested ({PLAN_ENV} unset); trainscale's plan "
                f"({plan.source}) would give local rank {local_rank} CPUs {format_cpulist(sorted(planned))}",
                f"export {PLAN_ENV}=topology to apply it, or see `trainscale profiles --here`",
            )
        )
    elif set(affinity) == planned or (set(affinity) <= planned and affinity):
        found.append(
            ok(
                BINDING,
                "plan",
                f"bound as planned ({plan.source}): CPUs {format_cpulist(sorted(planned))}"
                + ("" if set(affinity) == planned else " (only the part of it this job may use)"),
            )
        )
    else:
        found.append(
            warning(
                BINDING,
                "plan",
                f"{PLAN_ENV} plans CPUs {format_cpulist(sorted(planned))} for local "
                f"rank {local_rank} but it runs on {format_cpulist(sorted(affinity))}",
                "the plan is applied by trainscale's worker bootstrap (`trainscale run`, `trainscale "
                "slurm`); under plain srun give --cpu-bind=mask_cpu:... (`trainscale profiles --here` prints it)",
            )
        )
    gpus = topology.gpu_cores()
    gpu = mine.gpu if mine and mine.gpu is not None else None
    if gpu is not None and far_from_gpu(affinity, gpus.get(gpu, ())):
        found.append(
            warning(
                BINDING,
                "GPU locality",
                f"most of CPUs {format_cpulist(sorted(affinity))} are far from "
                f"GPU {gpu} (close: {format_cpulist(gpus[gpu])})",
                f"bind local rank {local_rank} to its GPU's cores: export {PLAN_ENV}=topology",
            )
        )
    return found


def cpus_per_rank(
    env: LaunchEnv | None, topology: Topology, affinity: frozenset[int], environ: Mapping[str, str]
) -> tuple[int, str]:
    """How many CPUs one rank really has, and why: unbound local ranks share one affinity set."""
    lws = env.local_world_size if env else 1
    bound = environ.get(PLAN_ENV, "").strip() not in ("", "none")
    # srun/mpirun usually bind each task to its own CPUs, so a set smaller than the node's belongs to one task.
    # (Tasks may look like torchrun's when RANK etc. are exported for them; only torchrun's agent sets this.)
    by_agent = env is not None and (env.elastic_agent or env.agent_store)
    if env and env.source != "single" and not by_agent and topology.cpus and set(affinity) != set(topology.cpus):
        bound = True
    if lws > 1 and not bound:
        per = max(1, len(affinity) // lws)
        return per, f"{len(affinity)} CPU(s) in the affinity shared by {lws} local ranks: {per} per rank"
    return max(1, len(affinity)), f"{len(affinity)} CPU(s) in this rank's affinity"


def collect_threads(
    environ: Mapping[str, str], cpus: int, why: str, *, workers: int | None = None, torch_threads: int | None = None
) -> list[Finding]:
    found = [ok(THREADS, "CPUs per rank", why, cpus_per_rank=cpus)]
    raw = environ.get("OMP_NUM_THREADS")
    extra = f"; torch uses {torch_threads} intra-op thread(s)" if torch_threads else ""
    if raw is None or raw.strip() == "":
        found.append(
            ok(
                THREADS,
                "OMP_NUM_THREADS",
                f"unset: trainscale.init() sets it to {cpus}{extra}",
                "a plain torchrun/srun without trainscale.init() leaves torch using every core per rank",
            )
        )
    else:
        try:
            threads = int(raw)
        except ValueError:
            threads = 0
        if threads < 1:
            found.append(
                error(
                    THREADS,
                    "OMP_NUM_THREADS",
                    f"OMP_NUM_THREADS={raw!r} is not a positive integer",
                    f"export OMP_NUM_THREADS={cpus} (the CPUs per rank), or unset it",
                )
            )
        elif threads > cpus:
            found.append(
                warning(
                    THREADS,
                    "OMP_NUM_THREADS",
                    f"OMP_NUM_THREADS={threads} but each rank has {cpus} CPU(s): threads oversubscribe "
                    f"the cores and compete{extra}",
                    f"export OMP_NUM_THREADS={cpus} or fewer, or unset it and let trainscale set it",
                    threads=threads,
                    cpus_per_rank=cpus,
                )
            )
        else:
            found.append(
                ok(
                    THREADS,
                    "OMP_NUM_THREADS",
                    f"OMP_NUM_THREADS={threads} for {cpus} CPU(s) per rank{extra}",
                    threads=threads,
                )
            )
    if workers is None:
        found.append(
            ok(THREADS, "DataLoader workers", "not checked", "give --workers N (your num_workers) to check it")
        )
    elif workers < 0:
        found.append(error(THREADS, "DataLoader workers", f"--workers {workers} is negative", "use 0 or more"))
    elif workers and workers >= cpus:
        found.append(
            warning(
                THREADS,
                "DataLoader workers",
                f"{workers} DataLoader worker(s) plus the training process on {cpus} CPU(s) per rank",
                (
                    f"use num_workers <= {cpus - 1} per rank"
                    if cpus > 1
                    else "use num_workers=0 (load in the training process)"
                )
                + ", or give each rank more CPUs "
                "(fewer ranks per node, or SLURM --cpus-per-task)",
                workers=workers,
                cpus_per_rank=cpus,
            )
        )
    else:
        found.append(
            ok(THREADS, "DataLoader workers", f"{workers} worker(s) for {cpus} CPU(s) per rank", workers=workers)
        )
    return found


def collect_load(load: float | None, cores: int, ranks_here: int = 1) -> list[Finding]:
    """Other work on this machine: a load average above its cores (less this launch's own ranks) makes every timing
    here (the network check, a study, the selftest) the other work's as much as the training's."""
    if load is None:
        return [ok(THREADS, "machine load", "not known (no load average on this system)")]
    other = max(0.0, load - ranks_here)
    if other > cores:
        return [
            warning(
                THREADS,
                "machine load",
                f"load average {load:.1f} on {cores} core(s): other work is running "
                "here, and every timing taken now (doctor --network, bench, selftest, training) is disturbed "
                "by it",
                "measure on a quiet node (an exclusive allocation), or after the other work ends (top shows it)",
                load=load,
                cores=cores,
            )
        ]
    return [ok(THREADS, "machine load", f"load average {load:.1f} on {cores} core(s)", load=load, cores=cores)]
