"""Processes started by mpirun (Open MPI) or a PMI launcher (MPICH, Intel MPI, PALS)."""

from __future__ import annotations

from collections.abc import Mapping

from trainscale.env.base import LaunchEnv, read_int, read_port

NAME = "mpi"

# (rank, size, local rank, local size) per MPI flavour, most specific first.
_FLAVOURS = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
    ("PMIX_RANK", "PMIX_SIZE", "PMIX_LOCAL_RANK", "PMIX_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "PALS_LOCAL_RANKID", "PALS_LOCAL_SIZE"),
)


def detect(environ: Mapping[str, str]) -> LaunchEnv | None:
    for rank_var, size_var, local_var, local_size_var in _FLAVOURS:  # noqa: B007  (the flavour found, used below)
        if rank_var in environ and size_var in environ:
            break
    else:
        return None
    world = read_int(environ, size_var, NAME)
    rank = read_int(environ, rank_var, NAME)
    local_rank = int(environ.get(local_var, "0")) if local_var in environ else 0
    local_world = int(environ.get(local_size_var, "0")) if local_size_var in environ else 0
    if local_world <= 0:
        # Without a local size, assume one rank per node (the safe choice for device selection).
        local_rank, local_world = 0, 1
    return LaunchEnv(
        source=NAME,
        rank=rank,
        local_rank=local_rank,
        world_size=world,
        local_world_size=local_world,
        node_rank=rank // local_world,
        num_nodes=max(1, -(-world // local_world)),
        master_addr=environ.get("MASTER_ADDR"),
        master_port=read_port(environ, "MASTER_PORT", NAME),
    )
