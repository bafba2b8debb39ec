"""A plain `python train.py`: one process, no process group needed."""

from __future__ import annotations

from collections.abc import Mapping

from trainscale.env.base import LaunchEnv

NAME = "single"


def detect(environ: Mapping[str, str]) -> LaunchEnv:
    return LaunchEnv(source=NAME, rank=0, local_rank=0, world_size=1, local_world_size=1, node_rank=0, num_nodes=1)
