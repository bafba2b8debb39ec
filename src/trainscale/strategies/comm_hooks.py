"""DDP communication hooks behind ``ddp:comm_hook=NAME``.

A DDP model carries at most one communication hook (torch refuses a second ``register_comm_hook``),
so trainscale registers at most one: a :class:`CommHook` holding the chosen hook (torch's fp16 or bf16
compression, PowerSGD, shared memory). With ``comm_hook=none`` nothing is registered: DDP keeps its built-in
C++ all-reduce, the fastest path. No hook is timed: the exposed communication of a step is the recorder's
(observe/hooks.py), whichever hook runs.

- ``fp16``/``bf16``: each bucket is cast to half precision, all-reduced, and cast back (half the bytes
  on the wire, some rounding). Before training, a one-element all-reduce in that dtype checks that the
  process group's backend can do it at all (gloo in torch 2.13 can do both; older builds could not).
- ``powersgd``: low-rank compression with error feedback (Vogels et al., 2019); the first
  ``powersgd_start`` steps all-reduce uncompressed. Its state (error feedback, step count) is not
  checkpointed: a resumed run starts it afresh.
- ``auto`` (the default): ``shm`` where every rank trains on the CPU of one node with gloo, else ``none``.
- ``shm``: CPU ranks on one node average through shared memory instead of gloo's loopback sockets
  (``strategies/shm_allreduce.py``); refused off the CPU or across nodes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from trainscale.errors import ConfigError
from trainscale.strategies import shm_allreduce

HOOKS = ("auto", "none", "fp16", "bf16", "powersgd", "shm")
HALF = {"fp16": torch.float16, "bf16": torch.bfloat16}
_ATTRIBUTE = "_trainscale_comm_hook"  # where a DDP model keeps its CommHook, beside torch's private list


class CommHook:
    """The hook a DDP model calls for each gradient bucket."""

    def __init__(self, name: str, fn: Callable[[Any, Any], torch.futures.Future], state: Any) -> None:
        self.name, self.fn, self.state = name, fn, state


def _run(hook, bucket):  # no annotations: DDP checks them against its own types, and these are strings
    return hook.fn(hook.state, bucket)


def _make(
    name: str, *, powersgd_rank: int = 1, powersgd_start: int = 10, gradient_bytes: int = 0
) -> tuple[Callable, Any]:
    stateless = {"fp16": default_hooks.fp16_compress_hook, "bf16": default_hooks.bf16_compress_hook}
    if name in stateless:
        return stateless[name], None
    if name == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=powersgd_rank, start_powerSGD_iter=powersgd_start
        )
        return powerSGD_hook.powerSGD_hook, state
    if name == "shm":
        return shm_allreduce.shm_hook, shm_allreduce.SharedMemoryAllReduce(gradient_bytes)
    raise ConfigError(f"no communication hook {name!r}", hint="one of " + ", ".join(HOOKS))


def attach(model: nn.Module, name: str, **options: Any) -> CommHook:
    """Register the hook ``name`` on a DDP model (compiled or not) and return its CommHook."""
    ddp = getattr(model, "_orig_mod", model)  # torch.compile's wrapper: the hook belongs to the DDP inside
    fn, state = _make(name, **options)
    hook = CommHook(name, fn, state)
    ddp.register_comm_hook(hook, _run)
    setattr(ddp, _ATTRIBUTE, hook)
    return hook


def attached(model: nn.Module) -> CommHook | None:
    """The CommHook trainscale registered on this model, if any."""
    return getattr(getattr(model, "_orig_mod", model), _ATTRIBUTE, None)


def check_backend(name: str, device: torch.device, process_group: Any = None) -> None:
    """Refuse, before training, a half-precision hook that this process group cannot all-reduce.

    A collective: every rank calls it (they all set up the same strategy)."""
    dtype = HALF.get(name)
    if dtype is None:
        return

    try:
        dist.all_reduce(torch.zeros(1, dtype=dtype, device=device), group=process_group)
    except (RuntimeError, ValueError, TypeError) as exc:
        other = "bf16" if name == "fp16" else "fp16"
        raise ConfigError(
            f"comm_hook={name}: the {dist.get_backend(process_group)} backend cannot all-reduce "
            f"{dtype} here ({str(exc).splitlines()[0][:160]})",
            hint=f"use comm_hook={other} if this backend supports it, or comm_hook=none",
        ) from None
