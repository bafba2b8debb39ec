"""Inside an allocation you already hold (``salloc -N 2``, or a batch script): `trainscale run --nnodes 2`
starts one agent per node with ``srun --overlap``, as a batch job's torchrun mode does, and
`trainscale jobs JOBID --attach` opens a shell or runs a command on a running job's node.

Planning is pure (over the environment); the CLI executes the commands.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from trainscale.env.slurm import expand_nodelist
from trainscale.errors import ConfigError

# Options with which the user already placed the nodes themselves: then trainscale does not spread.
PLACEMENT = ("rdzv_backend", "rdzv_endpoint", "master_addr", "master_port", "node_rank", "standalone")


def allocation_nodes(environ: Mapping[str, str]) -> list[str] | None:
    """The allocation's nodes when this process runs in one but outside any job step (an salloc shell,
    a batch script), else None (not in SLURM, or already a task of a step)."""
    if not environ.get("SLURM_JOB_ID") or not environ.get("SLURM_JOB_NODELIST"):
        return None
    step = environ.get("SLURM_STEP_ID")
    if step not in (None, "", "batch", "interactive", "extern", "4294967294", "4294967295"):
        return None

    return expand_nodelist(environ["SLURM_JOB_NODELIST"])


@dataclass(frozen=True)
class Spread:
    port_probe: list[str]
    """Runs on the first node and prints a free port there (the rendezvous is hosted there)."""
    launch: list[str]
    """srun with one `trainscale run` per node; ``{port}`` stands for the probed port."""
    nodes: list[str]


def plan_spread(
    options: list[str],
    target: list[str],
    nnodes: int,
    given: frozenset[str],
    environ: Mapping[str, str],
    python: str = sys.executable,
) -> Spread | None:
    """How to run ``trainscale run OPTIONS TARGET`` on ``nnodes`` nodes of the current allocation, or None
    when it need not (one node, not in an allocation, or the user gave the rendezvous themselves)."""
    nodes = allocation_nodes(environ)
    if nodes is None or nnodes <= 1 or set(PLACEMENT) & given:
        return None
    if nnodes > len(nodes):
        raise ConfigError(
            f"--nnodes {nnodes} but this allocation (job {environ['SLURM_JOB_ID']}) has "
            f"{len(nodes)} node(s): {','.join(nodes)}",
            hint=f"allocate more (salloc -N {nnodes} ...), or use --nnodes {len(nodes)}",
        )
    if shutil.which("srun") is None:
        raise ConfigError(
            "inside an allocation, but srun is not on this PATH to start the other nodes' agents",
            hint="load the SLURM module/PATH, or start `trainscale run` on each node yourself "
            "with --rdzv-backend c10d --rdzv-endpoint FIRST_NODE:PORT",
        )
    first, job = nodes[0], environ["SLURM_JOB_ID"]
    probe = [
        "srun",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        "-w",
        first,
        "--cpu-bind=none",
        python,
        "-m",
        "trainscale.launch.ports",
        "--host",
        first,
    ]
    cpus = environ.get("SLURM_CPUS_ON_NODE")
    launch = [
        "srun",
        "--overlap",
        f"--nodes={nnodes}",
        f"--ntasks={nnodes}",
        "--ntasks-per-node=1",
        *([f"--cpus-per-task={cpus}"] if cpus else []),
        "--cpu-bind=none",
        "--kill-on-bad-exit=1",
        python,
        "-m",
        "trainscale",
        "run",
        *options,
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{first}:{{port}}",
        "--rdzv-id",
        f"{job}-{os.getpid()}",
        *target,
    ]
    return Spread(port_probe=probe, launch=launch, nodes=nodes[:nnodes])


def attach_command(job_id: str, node: str | None, command: list[str]) -> list[str]:
    """``srun --jobid J --overlap`` into a running job: a login shell with a terminal, or the command."""
    return [
        "srun",
        "--jobid",
        job_id,
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        *(["-w", node] if node else []),
        *(command or ["--pty", os.environ.get("SHELL", "/bin/bash"), "-l"]),
    ]


def run_spread(plan: Spread, job_id: str, *, say) -> int:
    """Start one agent per node of the allocation (``srun --overlap``) on a port checked free on the first
    node; the exit status of the step."""
    probe = subprocess.run(plan.port_probe, capture_output=True, text=True, timeout=120)
    port = probe.stdout.strip()
    if probe.returncode != 0 or not port.isdigit():
        raise ConfigError(
            f"could not start a step on {plan.nodes[0]} of this allocation: "
            f"{(probe.stderr or probe.stdout).strip() or f'exit code {probe.returncode}'}",
            hint="is the allocation still alive (squeue)? srun --overlap needs SLURM 20.11 or newer",
        )
    say(
        f"inside allocation {job_id}: one agent per node on {','.join(plan.nodes)} (srun --overlap), "
        f"rendezvous on {plan.nodes[0]}:{port}"
    )
    return subprocess.call([part.replace("{port}", port) for part in plan.launch])
