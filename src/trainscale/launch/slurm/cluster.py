"""What this machine's scheduler says about its partitions (``sinfo``): the sizes a profile can only assume.

A profile describes a cluster; the scheduler here may be that cluster, another one (a test cluster, a
laptop's), or none. Where the job's partition is on this scheduler, its real node count, CPUs and memory
per node check the job (the lint's profile numbers are a cluster's typical node, not this partition's).
Where this scheduler has none of the profile's partitions, it is another cluster: it cannot check the job,
and ``sbatch --test-only`` here would answer for that other cluster, so it is not asked. Where it has one of
them (or the profile names none), a partition it lacks is a mistake ``sbatch --test-only`` refuses. Acts
(starts ``sinfo``), so it is kept apart from the pure lint.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from trainscale.launch.slurm.lint import ERROR, NOTE, Finding
from trainscale.launch.slurm.spec import JobPlan, parse_mem_gb
from trainscale.profiles.schema import ClusterProfile

FORMAT = "%P|%D|%c|%m"
"""Partition (``*`` marks the default), nodes, CPUs per node, memory per node in MB (``+``: some have more)."""


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    nodes: int
    cpus: int
    """CPUs of its smallest node."""
    mem_gb: float
    """Memory of its smallest node (0: the scheduler does not track memory)."""


def _number(text: str) -> float:
    digits = text.strip().rstrip("+")
    return float(digits) if digits.replace(".", "", 1).isdigit() else 0.0


def parse(text: str) -> dict[str, Partition]:
    """``sinfo -h -o FORMAT``'s rows, one partition from several rows (one per node shape or state)."""
    found: dict[str, Partition] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 4 or not fields[0]:
            continue
        name = fields[0].rstrip("*")
        row = Partition(
            name, fields[0].endswith("*"), int(_number(fields[1])), int(_number(fields[2])), _number(fields[3]) / 1024
        )
        if name in found:
            was = found[name]
            row = Partition(
                name,
                was.default or row.default,
                was.nodes + row.nodes,
                min(was.cpus, row.cpus),
                min(was.mem_gb, row.mem_gb),
            )
        found[name] = row
    return found


def partitions(run: Callable | None = None) -> dict[str, Partition] | None:
    """This machine's scheduler's partitions; None without ``sinfo`` or without an answer from the controller."""
    if run is None and not shutil.which("sinfo"):
        return None
    try:
        done = (run or subprocess.run)(
            ["sinfo", "-a", "-h", "-o", FORMAT], capture_output=True, text=True, timeout=30
        )  # -a: hidden partitions too
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse(done.stdout) or None if done.returncode == 0 else None


def findings(plan: JobPlan, profile: ClusterProfile, parts: dict[str, Partition] | None) -> tuple[list[Finding], bool]:
    """(findings, whether the job's cluster is the one here): the job checked against its partition's real sizes."""
    if parts is None:
        return [], True  # no scheduler answered here: sbatch --test-only says so itself
    wanted = plan.partition or next((p.name for p in parts.values() if p.default), None)
    if wanted is None:
        return [], True  # no partition asked for and no default here: the scheduler answers for itself
    named = [w.strip() for w in wanted.split(",") if w.strip()]  # -p a,b: the first of them that is here
    part = next((parts[w] for w in named if w in parts), None)
    if part is None and (not profile.partitions or any(p in parts for p in profile.partitions)):
        return [], True  # the profile's cluster is this one: a partition it lacks is sbatch's to refuse, in its words
    if part is None:
        return [
            Finding(
                NOTE,
                f"this machine's SLURM has no partition {wanted!r} (it has {', '.join(parts)}): it is "
                f"not the cluster profile {profile.name} describes, so nothing here checked the job with "
                "its scheduler",
                f"run --dry-run or --test-only on {profile.name}'s login node",
            )
        ], False
    out = []
    where = f"partition {part.name} (sinfo -p {part.name})"
    if plan.nodes > part.nodes:
        out.append(
            Finding(
                ERROR,
                f"--nodes {plan.nodes} but {where} has {part.nodes} node(s)",
                f"use --nodes {part.nodes} or fewer",
            )
        )
    cpus = plan.ranks_per_node * plan.cpus_per_rank
    if part.cpus and cpus > part.cpus:
        out.append(
            Finding(
                ERROR,
                f"{plan.ranks_per_node} rank(s) x {plan.cpus_per_rank} CPU(s) = {cpus} CPUs per "
                f"node, but the nodes of {where} have {part.cpus}",
                f"use at most {max(1, part.cpus // plan.ranks_per_node)} CPUs per rank (-c)",
            )
        )
    mem = plan.mem_per_gpu or plan.mem_per_node
    if mem and part.mem_gb >= 1:  # RealMemory=1: a scheduler that does not track memory
        per_node = parse_mem_gb(mem) * (plan.ranks_per_node if plan.mem_per_gpu else 1)
        if per_node > part.mem_gb:
            how = f"{plan.ranks_per_node} x --mem-per-gpu {mem}" if plan.mem_per_gpu else f"--mem {mem}"
            fix = (
                f"--mem-per-gpu {part.mem_gb / plan.ranks_per_node:.3g}G"
                if plan.mem_per_gpu
                else f"--mem {part.mem_gb:.3g}G"
            )
            out.append(
                Finding(
                    ERROR,
                    f"{per_node:g} GB per node asked for ({how}), but the nodes of {where} have {part.mem_gb:.3g} GB",
                    f"use {fix} or less",
                )
            )
    return out, True
