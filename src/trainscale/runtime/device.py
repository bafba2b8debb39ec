"""Which device and backend a rank uses. Pure decisions over the environment and visible devices."""

from __future__ import annotations

import os
from collections.abc import Mapping

import torch

from trainscale.env.base import LaunchEnv
from trainscale.errors import ConfigError

DEVICE_CHOICES = ("auto", "cpu", "cuda")
VISIBLE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


def visible_gpu_count() -> int:
    """GPUs this process can use (torch already honours the *_VISIBLE_DEVICES variables)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_index(env: LaunchEnv, visible: int, environ: Mapping[str, str] | None = None) -> int:
    """The GPU index for this rank among the visible ones: its local rank, one GPU per rank.

    One visible device (SLURM bound one GPU per task with --gpus-per-task or a per-rank
    *_VISIBLE_DEVICES) means index 0 whatever the local rank. Never two local ranks on one GPU:
    NCCL refuses that ("Duplicate GPU detected") only once every rank has started, so it is
    refused here, before the process group, with the fix.
    """
    if visible <= 0:
        raise ConfigError("no GPU is visible to this process", hint="use device='cpu', or check CUDA_VISIBLE_DEVICES")
    if visible == 1:
        if shares_the_only_gpu(env, os.environ if environ is None else environ):
            raise ConfigError(
                f"{env.local_world_size} local ranks would share the only visible GPU",
                hint="run one rank per GPU (`--nproc-per-node gpu`), give each rank its own GPU "
                "(SLURM --gpus-per-task=1), or use device='cpu'",
            )
        return 0
    if env.local_rank >= visible:
        raise ConfigError(
            f"local rank {env.local_rank} has no GPU of its own: {env.local_world_size} ranks on this node "
            f"but {visible} GPU(s) visible",
            hint=f"run at most {visible} rank(s) per node (`--nproc-per-node gpu`), give each task its own GPU "
            "(SLURM --gpus-per-task=1), pick one yourself with device='cuda:N', or use device='cpu'",
        )
    return env.local_rank


def shares_the_only_gpu(env: LaunchEnv, environ: Mapping[str, str]) -> bool:
    """True when the local ranks certainly see the same single GPU: the workers of torchrun's agent
    (``LaunchEnv.elastic_agent``) inherit its view, so with no *_VISIBLE_DEVICES
    narrowing it per rank they all see that one GPU. srun tasks with one GPU each, and per-rank
    variables, are the legitimate one-GPU cases."""
    return env.local_world_size > 1 and env.elastic_agent and not any(environ.get(name) for name in VISIBLE_VARS)


def pick_device(
    env: LaunchEnv, requested: str = "auto", visible: int | None = None, environ: Mapping[str, str] | None = None
) -> torch.device:
    if requested not in DEVICE_CHOICES and not requested.startswith("cuda:"):
        raise ConfigError(f"device {requested!r} is not supported", hint=f"use one of {', '.join(DEVICE_CHOICES)}")
    if requested == "cpu":
        return torch.device("cpu")
    visible = visible_gpu_count() if visible is None else visible
    if requested.startswith("cuda:"):
        return torch.device(requested)
    if visible == 0:
        if requested == "cuda":
            raise ConfigError(
                "device='cuda' but no GPU is visible",
                hint="run on a GPU node, check CUDA_VISIBLE_DEVICES/ROCR_VISIBLE_DEVICES, or use device='cpu'",
            )
        return torch.device("cpu")
    return torch.device("cuda", device_index(env, visible, environ))


MIXED_BACKEND = "cpu:gloo,cuda:nccl"
"""nccl for GPU tensors and gloo for CPU tensors in one group (FSDP with CPU offload reduces both)."""


def pick_backend(device: torch.device, requested: str | None = None) -> str:
    """nccl for CUDA and ROCm (torch maps nccl to RCCL on ROCm), gloo for CPU. ``requested`` may be
    ``MIXED_BACKEND``; a CPU rank then uses plain gloo (it has no GPU tensors to reduce)."""
    if requested:
        if requested not in ("gloo", "nccl", "mpi", MIXED_BACKEND):
            raise ConfigError(
                f"backend {requested!r} is not supported", hint=f"use gloo (CPU), nccl (CUDA/ROCm) or {MIXED_BACKEND}"
            )
        if requested == MIXED_BACKEND and device.type != "cuda":
            return "gloo"
        if requested == "nccl" and device.type != "cuda":
            raise ConfigError(
                "backend 'nccl' needs a GPU but this rank runs on the CPU", hint="use backend='gloo' on CPU"
            )
        return requested
    return "nccl" if device.type == "cuda" else "gloo"
