"""Check a job before it is submitted: the mistakes the seeds' Q&A lists, each with its fix.

Pure apart from the optional workload preflight (which reads the dataset's size): ``lint`` returns
findings, it never raises for a problem it can describe.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

from trainscale.errors import TrainscaleError, did_you_mean
from trainscale.findings import Finding
from trainscale.launch.slurm.container import container_of
from trainscale.launch.slurm.continuation import continues
from trainscale.launch.slurm.imports import unseen_imports
from trainscale.launch.slurm.render import sbatch_lines
from trainscale.launch.slurm.spec import (
    UNLIMITED,
    JobPlan,
    SlurmJobSpec,
    parse_mem_gb,
    parse_time,
    resolve,
    usable_cpus,
)
from trainscale.launch.slurm.toolchain import job_python
from trainscale.profiles.schema import ClusterProfile

ERROR, WARNING, NOTE = "error", "warning", "note"
VENV_FIX = (
    "make a venv inside the image (python3 -m venv --system-site-packages VENV; VENV/bin/pip install "
    "-e YOUR_TRAINSCALE_CLONE) and pass --python VENV/bin/python"
)
_URI = re.compile(r"^[a-z][a-z0-9+.-]*://")


def _extra(spec: SlurmJobSpec, *names: str) -> str | None:
    """Value of an option in the extra #SBATCH lines (``--name=V``, ``--name V`` or flag), else None."""
    for line in spec.extra_sbatch:
        m = re.match(r"^\s*(--[a-z-]+)(?:[=\s]+(\S+))?", line)
        if m and m.group(1) in names:
            return m.group(2) or ""
    return None


def _tasks(spec: SlurmJobSpec, plan: JobPlan) -> list[Finding]:
    out = []
    extra = _extra(spec, "--ntasks-per-node")
    tasks = int(extra) if extra and extra.isdigit() else plan.tasks_per_node
    where = f"--ntasks-per-node={tasks}"
    if plan.launcher == "torchrun" and tasks != 1:
        out.append(
            Finding(
                ERROR,
                f"{where} with the torchrun launch mode: SLURM would start {tasks} torchrun agents "
                f"per node, each starting {plan.ranks_per_node} ranks ({tasks * plan.ranks_per_node} per node)",
                "with --launcher torchrun SLURM must start one task per node: use --ntasks-per-node=1 "
                "(or leave it out), or use --launcher srun for one task per rank",
            )
        )
    if plan.launcher == "srun" and tasks != plan.ranks_per_node:
        out.append(
            Finding(
                ERROR,
                f"{where} but {plan.ranks_per_node} rank(s) per node with the srun launch mode",
                f"with --launcher srun SLURM starts one task per rank: use --ntasks-per-node="
                f"{plan.ranks_per_node} (or leave it out)",
            )
        )
    if spec.ntasks and spec.gpus_per_node and spec.ntasks != spec.gpus_per_node * spec.nodes:
        out.append(
            Finding(
                ERROR,
                f"-n/--ntasks {spec.ntasks} but --nodes {spec.nodes} x --gpus-per-node "
                f"{spec.gpus_per_node} = {spec.nodes * spec.gpus_per_node} ranks",
                "give one of them: -n (total ranks) or --gpus-per-node (ranks per node)",
            )
        )
    if _extra(spec, "--ntasks", "-n") is not None:
        out.append(
            Finding(
                WARNING,
                "--ntasks in the extra #SBATCH lines repeats what --nodes and the ranks per node say",
                "leave --ntasks out; trainscale derives the tasks from --nodes and --gpus-per-node",
            )
        )
    return out


def _binding(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan) -> list[Finding]:
    out = []
    cpus_per_gpu = spec.cpus_per_gpu or _extra(spec, "--cpus-per-gpu")
    if cpus_per_gpu and profile.forbid_cpus_per_gpu:
        out.append(
            Finding(
                ERROR,
                f"--cpus-per-gpu on profile {profile.name}: on this cluster it breaks GPU-to-GPU "
                "communication (the GPUs of one node end up in separate cgroups)",
                "leave --cpus-per-gpu out; trainscale gives each rank its GPU's cores with "
                "--cpus-per-task and a CPU bind mask",
            )
        )
    cpus_per_task = spec.cpus_per_task or _extra(spec, "--cpus-per-task")
    if cpus_per_gpu and cpus_per_task:
        out.append(
            Finding(
                ERROR,
                f"both --cpus-per-gpu={cpus_per_gpu} and --cpus-per-task={cpus_per_task}: "
                "two options bind the same CPUs, and SLURM refuses or silently picks one",
                "give only one of them (--cpus-per-task is the one that works with every launch mode)",
            )
        )
    if spec.cpus_per_task and _extra(spec, "--cpus-per-task") is not None:
        out.append(Finding(ERROR, "--cpus-per-task is given twice (option and extra #SBATCH line)", "keep one of them"))
    cpu_bind = spec.cpu_bind or _extra(spec, "--cpu-bind", "--cpu_bind")
    if cpu_bind and plan.launcher == "torchrun":
        out.append(
            Finding(
                ERROR,
                f"--cpu-bind={cpu_bind} with the torchrun launch mode: the single task per node "
                "would pin all its ranks to one rank's CPUs",
                "leave --cpu-bind out: in torchrun mode each worker binds itself from the profile's "
                "plan; or use --launcher srun",
            )
        )
    if _extra(spec, "--gpus-per-task", "--gpus", "-G", "--gres") is not None and plan.gpus_per_node:
        out.append(
            Finding(
                ERROR,
                "GPUs are asked for twice: --gpus-per-node from trainscale and "
                "--gpus/--gpus-per-task/--gres in the extra lines",
                "leave the extra GPU option out",
            )
        )
    return out


def _cpus(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan) -> list[Finding]:
    out = []
    if plan.cpus_per_rank < spec.dataloader_workers + 1:
        out.append(
            Finding(
                WARNING,
                f"{plan.cpus_per_rank} CPU(s) per rank but {spec.dataloader_workers} DataLoader "
                f"worker(s) + the training process need {spec.dataloader_workers + 1}",
                f"use at most {max(0, plan.cpus_per_rank - 1)} DataLoader workers, or give each rank more "
                "CPUs (--cpus-per-task)",
            )
        )
    total = plan.cpus_per_rank * plan.ranks_per_node
    if total > usable_cpus(profile):
        out.append(
            Finding(
                ERROR,
                f"{plan.ranks_per_node} rank(s) x {plan.cpus_per_rank} CPU(s) = {total} CPUs per node, "
                f"but profile {profile.name} has {usable_cpus(profile)} usable",
                f"use at most {usable_cpus(profile) // plan.ranks_per_node} CPUs per rank",
            )
        )
    return out


def _resources(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan) -> list[Finding]:
    out = []
    ranks = plan.ranks_per_node
    if profile.gpus_per_node and ranks > profile.gpus_per_node:
        out.append(
            Finding(
                ERROR,
                f"--gpus-per-node {ranks} but a {profile.name} node has {profile.gpus_per_node} GPU(s)",
                f"use --gpus-per-node {profile.gpus_per_node} or fewer, and more --nodes",
            )
        )
    mem = plan.mem_per_gpu or plan.mem_per_node
    if mem and profile.mem_per_node_gb:
        per_node = parse_mem_gb(mem) * (ranks if plan.mem_per_gpu else 1)
        if per_node > profile.mem_per_node_gb:
            how = f"{ranks} x {mem}" if plan.mem_per_gpu else f"--mem {mem}"
            out.append(
                Finding(
                    ERROR,
                    f"{per_node:g} GB per node asked for ({how}), "
                    f"but a {profile.name} node has {profile.mem_per_node_gb:g} GB",
                    f"use --mem-per-gpu {profile.mem_per_node_gb / ranks:.0f}G or less",
                )
            )
    if profile.requires_account and not (spec.account or _extra(spec, "--account", "-A")):
        out.append(
            Finding(
                ERROR,
                f"no --account: every job on {profile.name} must name the project it is charged to",
                "add --account PROJECT (e.g. --account project_465000000 on LUMI)",
            )
        )
    if profile.max_time and plan.time_s == UNLIMITED:
        out.append(
            Finding(
                NOTE,
                f"--time {spec.time}: no limit asked for, so the partition's own limit "
                f"({profile.max_time} on {profile.name}) applies",
                "give --time to plan around it",
            )
        )
    elif profile.max_time and plan.time_s > parse_time(profile.max_time):
        out.append(
            Finding(
                ERROR,
                f"--time {spec.time} is above the partition's limit {profile.max_time}",
                f"use --time {profile.max_time} or less, and checkpoint to continue in a new job",
            )
        )
    if plan.partition and profile.partitions and plan.partition not in profile.partitions:
        out.append(
            Finding(
                WARNING,
                f"partition {plan.partition!r} is not one profile {profile.name} knows",
                did_you_mean(plan.partition, profile.partitions),
            )
        )
    if spec.container and profile.container is None:
        runtime = container_of(profile)
        out.append(
            Finding(
                NOTE,
                f"profile {profile.name} has no [container] table: the job runs `{runtime.runtime} "
                f"{runtime.mode}{''.join(' ' + f for f in runtime.flags)}` with the job's own binds only",
                "for site binds, another runtime or set-up lines add a [container] table to a profile "
                "that extends this one (docs/profiles.md)",
            )
        )
    return out


def _container(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan) -> list[Finding]:
    out = []
    image = spec.container
    if image and not _URI.match(image) and not Path(image).expanduser().exists():
        out.append(
            Finding(
                ERROR,
                f"container image {image} does not exist on this machine",
                "give the path of the .sif file (or image directory) as the compute nodes see it; "
                "login and compute nodes share the project file systems",
            )
        )
    python = job_python(spec, profile)
    if plan.facts.imports_trainscale and python.kit and not spec.python:
        what = (
            f"workload {spec.workload}" if spec.workload else f"{spec.script or spec.module} imports trainscale, and it"
        )
        where = (
            f"needs trainscale importable inside {image}; a stock image does"
            if image
            else "needs trainscale importable in the python3 its module lines give; a module's Python does"
        )
        out.append(
            Finding(
                WARNING,
                f"{what} {where} not have it (the job stops in its first seconds if so)",
                VENV_FIX if image else VENV_FIX.replace("inside the image", "on top of the module"),
            )
        )
    return out


def _code(spec: SlurmJobSpec, plan: JobPlan) -> list[Finding]:
    """What the job will not see of the code ``trainscale run`` would import (launch/slurm/snapshot.py)."""
    if not spec.script or plan.code_root is None or not Path(spec.script).is_file():
        return []
    root, script = plan.code_root, Path(spec.script).absolute()
    if root not in script.parents:
        return [
            Finding(
                ERROR,
                f"the script {spec.script} is outside --snapshot {spec.snapshot}: the job runs the "
                "script from the snapshot",
                f"give --snapshot a directory that holds {script.name}, or leave "
                "--snapshot out: the script's project is found for you",
            )
        ]
    out = []
    home = Path(os.path.expanduser("~")).absolute()
    for miss in unseen_imports(script, root, plan.facts.path_additions, plan.facts.imports):
        both = Path(os.path.commonpath([str(root), miss.location]))
        wide = both == home or both in home.parents or both.parent == both  # never suggest all of $HOME or /
        out.append(
            Finding(
                WARNING if miss.optional else ERROR,
                f"{script.name} line {miss.line} imports {miss.module} from {miss.location}, through a "
                f"directory it adds to sys.path relative to its own file; the job gets a snapshot of "
                f"{root} only, so it will not see {miss.module}",
                (
                    f"move {miss.module} into {root}, "
                    if wide
                    else f"snapshot a directory that holds both: --snapshot {both}; "
                )
                + f"or install {miss.module} (pip install -e) so it is imported from where it is",
            )
        )
    return out


def _gpus(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan) -> list[Finding]:
    out = []
    if plan.gpu_visibility_reason:
        out.append(
            Finding(
                NOTE,
                plan.gpu_visibility_reason,
                "--gpu-visibility task gives each task only its own GPU (then use cuda:0 or 'cuda')",
            )
        )
    if (
        spec.gpu_visibility == "task"
        and plan.launcher == "srun"
        and plan.facts.gpu_index_line is not None
        and plan.gpus_per_node
    ):
        out.append(
            Finding(
                ERROR,
                f"--gpu-visibility task shows each task only its own GPU, but "
                f"{plan.facts.path} line {plan.facts.gpu_index_line} picks a GPU by rank index "
                f"({plan.facts.gpu_index_code}): every rank but local rank 0 would ask for a GPU it cannot see",
                "use --gpu-visibility node (or auto), or select torch.device('cuda') / cuda:0 in the script",
            )
        )
    if plan.partial_node and profile.binding == "map":
        out.append(
            Finding(
                NOTE,
                f"{plan.ranks_per_node} of a {profile.name} node's {profile.gpus_per_node} GPUs "
                "without --exclusive: SLURM chooses which GPUs and cores the job gets, so the profile's "
                "fixed CPU masks are not applied; each rank binds to its GPU's cores on the node",
                f"add --exclusive (and --gpus-per-node {profile.gpus_per_node}) for the fixed masks",
            )
        )
    return out


RESUMABLE_HINT = (
    "make it resumable with rt in four lines: start = rt.resume(model, optimizer) before the loop, "
    "loop from start, and rt.checkpoint(step + 1, model, optimizer, every=100) in it (README, "
    "'Resumable anywhere'); or use --workload, whose training loop checkpoints"
)


def _continuation(spec: SlurmJobSpec, plan: JobPlan) -> list[Finding]:
    """--requeue/--chain on a script that does not checkpoint through trainscale starts again from zero."""
    if (
        not continues(spec)
        or spec.workload
        or (spec.module or "").startswith("trainscale.")
        or plan.facts.path is None
        or plan.facts.checkpoints
    ):
        return []
    how = "--requeue" if spec.requeue else f"--chain {spec.chain}"
    what = Path(plan.facts.path).name
    why = (
        "a requeued job or the chain's next link runs it again from the beginning"
        if plan.facts.imports_trainscale
        else "it does not import trainscale, so SLURM's warning signal ends it without a checkpoint, and a requeued "
        "job or the chain's next link runs it again from the beginning"
    )
    return [
        Finding(
            WARNING,
            f"{how}: {what} does not checkpoint through trainscale (no rt.checkpoint/rt.resume, "
            f"Checkpointer, Loop or built-in workload in its source): {why}",
            RESUMABLE_HINT,
        )
    ]


def _duplicates(text: str) -> list[Finding]:
    """An extra --sbatch line repeating an option trainscale already writes."""
    seen: dict[str, int] = {}
    for line in text.splitlines():
        m = re.match(r"#SBATCH (--[\w-]+)", line)
        if m:
            seen[m.group(1)] = seen.get(m.group(1), 0) + 1
    return [
        Finding(
            ERROR,
            f"{name} is given twice (a trainscale option and an --sbatch line)",
            f"keep one: trainscale has {name} as its own option (see trainscale slurm --help)",
        )
        for name, count in seen.items()
        if count > 1 and name not in _CHECKED_TWICE
    ]


_CHECKED_TWICE = ("--cpus-per-task", "--ntasks-per-node")  # _binding/_tasks explain these with more context


Preflight = Callable[..., None]
"""A workload's check ``preflight(argv, world_size, *, gpus)`` that its options suit ``world_size``
ranks (with GPUs or not) and its data can feed them; raises a TrainscaleError when not."""


def _target(spec: SlurmJobSpec, plan: JobPlan, preflight: Preflight | None) -> list[Finding]:
    if spec.script and not Path(spec.script).is_file():
        return [
            Finding(
                ERROR,
                f"script {spec.script!r} does not exist",
                "give the path of your training script (it must be visible from the compute nodes)",
            )
        ]
    if preflight is None:
        return []
    try:
        preflight(list(spec.args), plan.world_size, gpus=plan.gpus_per_node > 0)
    except TrainscaleError as exc:
        what = spec.workload or spec.module or spec.script
        return [
            Finding(
                ERROR,
                f"{what} with world size {plan.world_size}: {exc.message}",
                exc.hint or "change the batch size or the number of ranks",
            )
        ]
    return []


def lint(
    spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan | None = None, *, preflight: Preflight | None = None
) -> list[Finding]:
    """All findings for ``spec`` on ``profile``, errors first.

    ``preflight`` (e.g. a workload's ``preflight``) checks that the data can feed every rank; the
    launch layer cannot import workloads, so the caller passes it.
    """
    plan = plan or resolve(spec, profile)
    rendered = "\n".join(sbatch_lines(spec, profile, plan))
    found = (
        _tasks(spec, plan)
        + _binding(spec, profile, plan)
        + _cpus(spec, profile, plan)
        + _resources(spec, profile, plan)
        + _container(spec, profile, plan)
        + _code(spec, plan)
        + _gpus(spec, profile, plan)
        + _continuation(spec, plan)
        + _duplicates(rendered)
        + _target(spec, plan, preflight)
    )
    return sorted(found, key=lambda f: (ERROR, WARNING, NOTE).index(f.level))


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.level == ERROR]
