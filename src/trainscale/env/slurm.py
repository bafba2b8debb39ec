"""Tasks started by `srun` directly, one task per rank (no torchrun in between)."""

from __future__ import annotations

import re
from collections.abc import Mapping

from trainscale.env.base import LaunchEnv, read_int, read_port
from trainscale.errors import LaunchError

NAME = "slurm"

# When no MASTER_PORT was exported, every task derives the same port from the job id. This is the
# fallback only: `trainscale slurm` exports a port it has checked is free on the master node.
PORT_BASE, PORT_SPAN = 20000, 20000


def expand_tasks_per_node(spec: str) -> list[int]:
    """``'2(x3),1'`` -> ``[2, 2, 2, 1]`` (SLURM's compressed SLURM_TASKS_PER_NODE form)."""
    counts: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if not match:
            raise LaunchError(
                f"slurm: cannot read SLURM_TASKS_PER_NODE={spec!r}",
                hint="expected a list like '4' or '2(x3),1'",
            )
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def expand_nodelist(nodelist: str) -> list[str]:
    """``'n[1-3],gpu07'`` -> ``['n1', 'n2', 'n3', 'gpu07']`` with python-hostlist."""
    import hostlist  # noqa: PLC0415 (job kit)

    try:
        return list(hostlist.expand_hostlist(nodelist))
    except hostlist.BadHostlist as exc:
        raise LaunchError(
            f"slurm: cannot expand SLURM_JOB_NODELIST={nodelist!r}: {exc}", hint="is this a SLURM host list?"
        ) from None


def job_port(job_id: str | None) -> int:
    digits = re.sub(r"\D", "", job_id or "") or "0"
    return PORT_BASE + int(digits[-6:]) % PORT_SPAN


def _first_node(environ: Mapping[str, str]) -> str | None:
    # Only when MASTER_ADDR is not exported (trainscale's batch scripts export it): expanding a host
    # list needs python-hostlist, which a stock container may lack.
    nodes = expand_nodelist(environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_JOB_NODELIST", ""))
    return nodes[0] if nodes else None


def detect(environ: Mapping[str, str]) -> LaunchEnv | None:
    # SLURM_PROCID is set for srun tasks, but also in a batch step and an salloc shell, which are
    # not a distributed launch: SLURM_STEP_ID tells a task of a real step from those, and the
    # batch/extern steps carry the special names 'batch'/'extern' (or 4294967294/5 on old releases).
    if "SLURM_PROCID" not in environ or "SLURM_STEP_ID" not in environ:
        return None
    if environ["SLURM_STEP_ID"] in ("batch", "extern", "interactive", "4294967294", "4294967295"):
        return None
    node_rank = read_int(environ, "SLURM_NODEID", NAME)
    tasks_per_node = expand_tasks_per_node(
        environ.get("SLURM_STEP_TASKS_PER_NODE")
        or environ.get("SLURM_TASKS_PER_NODE")
        or environ.get("SLURM_NTASKS", "1")
    )
    if node_rank >= len(tasks_per_node):
        raise LaunchError(
            f"slurm: SLURM_NODEID={node_rank} but SLURM_TASKS_PER_NODE lists {len(tasks_per_node)} node(s)",
            hint="the step's environment is inconsistent; launch ranks with a plain `srun` inside the allocation",
        )
    job_id = environ.get("SLURM_JOB_ID")
    port = read_port(environ, "MASTER_PORT", NAME) or job_port(job_id)
    return LaunchEnv(
        source=NAME,
        rank=read_int(environ, "SLURM_PROCID", NAME),
        local_rank=read_int(environ, "SLURM_LOCALID", NAME),
        world_size=int(environ.get("SLURM_STEP_NUM_TASKS") or read_int(environ, "SLURM_NTASKS", NAME)),
        local_world_size=tasks_per_node[node_rank],
        node_rank=node_rank,
        num_nodes=len(tasks_per_node),
        master_addr=environ.get("MASTER_ADDR") or _first_node(environ),
        master_port=port,
        restart_count=int(environ.get("SLURM_RESTART_COUNT", "0")),
        job_id=job_id,
    )
