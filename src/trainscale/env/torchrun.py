"""Processes started by torchrun / torch.distributed.run (also inside a SLURM job)."""

from __future__ import annotations

from collections.abc import Mapping

from trainscale.env.base import LaunchEnv, read_int, read_port

NAME = "torchrun"


def detect(environ: Mapping[str, str]) -> LaunchEnv | None:
    # TORCHELASTIC_RUN_ID is set by the elastic agent only; RANK+LOCAL_RANK+WORLD_SIZE also covers
    # the older torch.distributed.launch and hand-exported variables (seed 004's multi-node script).
    if not ("TORCHELASTIC_RUN_ID" in environ or {"RANK", "LOCAL_RANK", "WORLD_SIZE"} <= environ.keys()):
        return None
    world = read_int(environ, "WORLD_SIZE", NAME)
    local_world = int(environ.get("LOCAL_WORLD_SIZE", world)) if environ.get("LOCAL_WORLD_SIZE") else world
    node_rank = int(environ.get("GROUP_RANK", environ.get("NODE_RANK", "0")))
    num_nodes = max(1, -(-world // local_world))
    return LaunchEnv(
        source=NAME,
        rank=read_int(environ, "RANK", NAME),
        local_rank=read_int(environ, "LOCAL_RANK", NAME),
        world_size=world,
        local_world_size=local_world,
        node_rank=node_rank,
        num_nodes=num_nodes,
        master_addr=environ.get("MASTER_ADDR"),
        master_port=read_port(environ, "MASTER_PORT", NAME),
        restart_count=int(environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        job_id=environ.get("SLURM_JOB_ID") or environ.get("TORCHELASTIC_RUN_ID"),
    )
