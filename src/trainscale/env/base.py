"""The launch-environment record every detector returns."""

from __future__ import annotations

import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from trainscale.errors import LaunchError


@dataclass(frozen=True, kw_only=True)
class LaunchEnv:
    """Where this process sits in the job, as read from the environment (nothing is changed)."""

    source: str
    """Which launcher set the environment: torchrun, slurm, mpi or single."""
    rank: int
    """Global rank, 0 .. world_size-1."""
    local_rank: int
    """Rank on this node, 0 .. local_world_size-1."""
    world_size: int
    """Number of processes in the job."""
    local_world_size: int
    """Processes on this node."""
    node_rank: int
    """Index of this node, 0 .. num_nodes-1."""
    num_nodes: int
    """Nodes in the job."""
    master_addr: str | None = None
    """Address of rank 0's store; None for a single process."""
    master_port: int | None = None
    """Port of rank 0's store; None for a single process."""
    restart_count: int = 0
    """How many times the launcher has restarted this group (torchrun's TORCHELASTIC_RESTART_COUNT)."""
    job_id: str | None = None
    """Scheduler job id when there is one."""
    # The facts below are the same whichever launcher started the process (:func:`job_facts`).
    slurm_job_id: str | None = None
    """The SLURM job this process runs in (SLURM_JOB_ID), under any launcher or none (a batch script)."""
    requeue_count: int = 0
    """How many times SLURM requeued this job (SLURM_RESTART_COUNT), under any launcher inside it."""
    requeue_job: str | None = None
    """What ``scontrol requeue`` takes for this job: ``ARRAYJOB_TASK`` in an array, else the job id."""
    job_dir: str | None = None
    """This job's directory (TRAINSCALE_JOB_DIR, set by trainscale's batch scripts): logs, markers."""
    run_dir: str | None = None
    """The run's directory (TRAINSCALE_RUN_DIR): one per submission, sweep task or chain."""
    elastic_agent: bool = False
    """torchrun's elastic agent started this worker (TORCHELASTIC_RUN_ID, which only the agent sets)."""
    agent_store: bool = False
    """torchrun's agent hosts the store and the workers connect to it (TORCHELASTIC_USE_AGENT_STORE)."""
    on_signal: str = "requeue"
    """What a preempted run does after its checkpoint (TRAINSCALE_ON_SIGNAL): requeue, or stop (a chain link)."""
    max_requeues: int | None = None
    """Requeues after which a preempted run stops instead (TRAINSCALE_MAX_REQUEUES, from --max-requeues)."""
    preempt_signals: tuple[str, ...] = ("SIGUSR1",)
    """Signals that mean "checkpoint and stop" (TRAINSCALE_PREEMPT_SIGNALS, e.g. SIGUSR2)."""
    preempt_check_every: int = 10
    """Steps between the ranks' agreement on a preemption (TRAINSCALE_PREEMPT_CHECK_EVERY)."""
    job_end: float | None = None
    """When the job's time limit ends, in seconds since the epoch (TRAINSCALE_JOB_END, from squeue at the job's
    start): the last save is timed from measured save durations to finish before it."""

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise LaunchError(
                f"{self.source}: world size {self.world_size} < 1", hint="check the launcher's task count"
            )
        if not 0 <= self.rank < self.world_size:
            raise LaunchError(
                f"{self.source}: rank {self.rank} is outside 0..{self.world_size - 1}",
                hint="the launcher's rank and size variables disagree; do not set RANK/WORLD_SIZE by hand",
            )
        if not 0 <= self.local_rank < self.local_world_size:
            raise LaunchError(
                f"{self.source}: local rank {self.local_rank} is outside 0..{self.local_world_size - 1}",
                hint="the launcher's local rank and local size variables disagree",
            )
        if self.world_size > 1 and (not self.master_addr or not self.master_port):
            raise LaunchError(
                f"{self.source}: {self.world_size} processes but no master address/port",
                hint="set MASTER_ADDR and MASTER_PORT, or launch with `trainscale run` / `trainscale slurm`",
            )

    @property
    def is_distributed(self) -> bool:
        return self.world_size > 1

    @property
    def attempt(self) -> int:
        """0 on the first run; counts SLURM requeues and torchrun restarts (an srun task's restart
        count already is SLURM's)."""
        return self.restart_count if self.source == "slurm" else self.requeue_count + self.restart_count


def read_int(environ: Mapping[str, str], name: str, source: str) -> int:
    """An integer variable, with an error naming the variable when it is not one."""
    raw = environ.get(name)
    if raw is None:
        raise LaunchError(
            f"{source}: {name} is not set", hint=f"{source} normally sets it; was the script started by {source}?"
        )
    try:
        return int(raw)
    except ValueError:
        raise LaunchError(
            f"{source}: {name}={raw!r} is not an integer", hint=f"unset {name} or give it a whole number"
        ) from None


def read_port(environ: Mapping[str, str], name: str, source: str) -> int | None:
    raw = environ.get(name)
    if raw is None or raw == "":
        return None
    port = read_int(environ, name, source)
    if not 0 < port < 65536:
        raise LaunchError(f"{source}: {name}={port} is not a TCP port", hint="use a port between 1024 and 65535")
    return port


def job_facts(environ: Mapping[str, str]) -> dict[str, Any]:
    """The :class:`LaunchEnv` fields that do not depend on the launcher: requeues, the job's and run's
    directories, torchrun's agent store and what the batch script asks of a preemption."""
    facts: dict[str, Any] = {
        "requeue_count": read_int(environ, "SLURM_RESTART_COUNT", "slurm") if environ.get("SLURM_RESTART_COUNT") else 0,
        "slurm_job_id": environ.get("SLURM_JOB_ID") or None,
        "elastic_agent": bool(environ.get("TORCHELASTIC_RUN_ID")),
        "job_dir": environ.get("TRAINSCALE_JOB_DIR") or None,
        "run_dir": environ.get("TRAINSCALE_RUN_DIR") or None,
        "agent_store": environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True",
        "on_signal": environ.get("TRAINSCALE_ON_SIGNAL") or "requeue",
        "preempt_signals": signal_names(environ.get("TRAINSCALE_PREEMPT_SIGNALS") or "SIGUSR1"),
    }
    if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
        facts["requeue_job"] = f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    else:
        facts["requeue_job"] = environ.get("SLURM_JOB_ID") or None
    if environ.get("TRAINSCALE_MAX_REQUEUES"):
        facts["max_requeues"] = read_int(environ, "TRAINSCALE_MAX_REQUEUES", "trainscale")
    if environ.get("TRAINSCALE_JOB_END"):
        facts["job_end"] = float(read_int(environ, "TRAINSCALE_JOB_END", "trainscale"))
    if environ.get("TRAINSCALE_PREEMPT_CHECK_EVERY"):
        facts["preempt_check_every"] = max(1, read_int(environ, "TRAINSCALE_PREEMPT_CHECK_EVERY", "trainscale"))
    return facts


def signal_names(text: str) -> tuple[str, ...]:
    """``"USR2,SIGTERM"`` -> ``("SIGUSR2", "SIGTERM")``; an unknown name is an error naming it."""
    names = []
    for raw in filter(None, (part.strip().upper() for part in text.split(","))):
        name = raw if raw.startswith("SIG") else "SIG" + raw
        if not isinstance(getattr(signal, name, None), signal.Signals):
            raise LaunchError(
                f"TRAINSCALE_PREEMPT_SIGNALS names {raw!r}, which is not a signal",
                hint="e.g. TRAINSCALE_PREEMPT_SIGNALS=SIGUSR1 (trainscale slurm --signal USR1@120)",
            )
        names.append(name)
    return tuple(names)
