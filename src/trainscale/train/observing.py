"""What the built-in training loop adds to the recorder every script has (observe/hooks.py): its name,
strategy and batch in the records, epoch records (its wall time, losses, held-out metrics), a step's FLOPs
counted its own way for sharded models, and the network check after the first step. Nothing here synchronises
the device or adds a collective. The files and fields: docs/observability.md.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from trainscale.errors import ConfigError
from trainscale.observe import hooks, interconnect
from trainscale.observe.flops import count_step_flops, plain_step_flops
from trainscale.observe.records import note_event


def recorder_for(rt: Any, environ: Any = os.environ) -> Any:
    """The process's recorder (the worker bootstrap's), or one installed now (the loop run in-process); None
    without a run directory or with ``TRAINSCALE_RECORD=0``."""
    return hooks.current() or hooks.install(rt.env.run_dir, environ=environ)


def step_flops(
    module: torch.nn.Module,
    build: Callable[[], torch.nn.Module],
    loss: Callable[[Any, Any], torch.Tensor],
    batch: Any,
    micro_batches: int = 1,
    *,
    device: Any = "cpu",
) -> int | None:
    """FLOPs of one optimizer step (forward + backward of ``micro_batches`` batches like ``batch``), by
    torch's FlopCounterMode: a module with plain parameters (ddp, zero1) as every script's is counted
    (observe/flops.py); a sharded one (fsdp, deepspeed) is rebuilt from ``build`` in fake tensors (shapes only;
    importing that machinery takes about a second) on the rank's ``device``, with a batch of the same shapes
    where the batch was: the loss then moves it where it moves the real one (a copy built on the CPU met the
    batch the loss had moved to the GPU, and nothing was counted). None where neither works (e.g. the loss
    reads a value)."""
    try:
        counted = plain_step_flops(module, lambda m: loss(m, batch), micro_batches)
        if counted is not None:
            return counted
        from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: PLC0415 (optional dependency)
        from torch.utils._pytree import tree_map  # noqa: PLC0415 (optional dependency)

        with torch.random.fork_rng(devices=[]), FakeTensorMode(allow_non_fake_inputs=True):
            with torch.device(device):
                copy = build()
            fake_batch = tree_map(
                lambda t: (
                    torch.empty(t.shape, dtype=t.dtype, device=t.device)  # fake: in the mode
                    if isinstance(t, torch.Tensor)
                    else t
                ),
                batch,
            )
            return count_step_flops(lambda: loss(copy, fake_batch).backward()).times(micro_batches)
    except Exception:  # counting is a nicety: a model it cannot count still trains
        return None


def check_network(rt: Any, run_dir: str | None, environ: Any = os.environ) -> None:
    """Which network NCCL picked, against the profile's; a required mismatch stops the run here."""
    expected = environ.get(interconnect.EXPECTED_VAR, "")
    path = environ.get("NCCL_DEBUG_FILE")
    if not expected or not path or "nccl" not in str(rt.backend) or rt.num_nodes < 2:
        return
    required = environ.get(interconnect.REQUIRED_VAR) == "1"
    verdict = interconnect.check_file(path, expected=expected, multi_node=True, required=required)
    if verdict.level != "ok" and rt.local_rank == 0:
        print(
            f"trainscale: network: {verdict.message}" + (f"\n  hint: {verdict.hint}" if verdict.hint else ""),
            file=sys.stderr,
            flush=True,
        )
    if rt.is_main and run_dir:
        note_event(run_dir, kind="interconnect", level=verdict.level, message=verdict.message)
    if verdict.level == "error":
        raise ConfigError(verdict.message, hint=verdict.hint)
