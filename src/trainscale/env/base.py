"""The launch-environment record every detector returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

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

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise LaunchError(f"{self.source}: world size {self.world_size} < 1", hint="check the launcher's task count")
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
    def init_method(self) -> str | None:
        """``tcp://addr:port`` for torch.distributed, so nothing has to be written to os.environ."""
        if self.master_addr is None or self.master_port is None:
            return None
        host = f"[{self.master_addr}]" if ":" in self.master_addr else self.master_addr
        return f"tcp://{host}:{self.master_port}"


def read_int(environ: Mapping[str, str], name: str, source: str) -> int:
    """An integer variable, with an error naming the variable when it is not one."""
    raw = environ.get(name)
    if raw is None:
        raise LaunchError(f"{source}: {name} is not set", hint=f"{source} normally sets it; was the script started by {source}?")
    try:
        return int(raw)
    except ValueError:
        raise LaunchError(f"{source}: {name}={raw!r} is not an integer", hint=f"unset {name} or give it a whole number") from None


def read_port(environ: Mapping[str, str], name: str, source: str) -> int | None:
    raw = environ.get(name)
    if raw is None or raw == "":
        return None
    port = read_int(environ, name, source)
    if not 0 < port < 65536:
        raise LaunchError(f"{source}: {name}={port} is not a TCP port", hint="use a port between 1024 and 65535")
    return port
