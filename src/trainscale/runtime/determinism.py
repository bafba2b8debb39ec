"""Deterministic mode: the settings that make a GPU run repeat itself bit for bit (docs/gpu.md).

On CPUs trainscale's runs are deterministic already. On GPUs cuBLAS, cuDNN/MIOpen and a few kernels
(atomic adds) may pick a different summation order from run to run; this turns all of that off, at
some speed. NCCL's reductions repeat themselves for the same ranks, sizes and topology.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, MutableMapping

import torch

CUBLAS_CONFIG = ":4096:8"
"""cuBLAS workspace config torch asks for under deterministic algorithms (CUDA >= 10.2)."""


def enable_determinism(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Turn on deterministic algorithms; return a note for each setting made (for rank 0's log).

    Must run before the first cuBLAS call (``trainscale.init`` calls it first thing). An operation
    without a deterministic implementation then raises an error naming itself, rather than silently
    varying.
    """
    environ = os.environ if environ is None else environ
    notes = []
    if "CUBLAS_WORKSPACE_CONFIG" not in environ:
        environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_CONFIG
        notes.append(f"CUBLAS_WORKSPACE_CONFIG={CUBLAS_CONFIG} (deterministic cuBLAS; set it yourself to override)")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False  # benchmarking may pick a different algorithm each run
    torch.backends.cudnn.deterministic = True
    notes.append(
        "deterministic algorithms on (torch.use_deterministic_algorithms, cudnn.benchmark off): "
        "bitwise-repeatable GPU runs, somewhat slower"
    )
    return notes


@contextlib.contextmanager
def deterministic(enabled: bool = True) -> Iterator[None]:
    """Deterministic algorithms for a block only (``trainscale selftest``'s resume check), then as before:
    the other checks run ops (FSDP2, ZeRO-3) that have no deterministic kernel and would raise.
    CUBLAS_WORKSPACE_CONFIG must already be set, before the process's first cuBLAS call."""
    if not enabled:
        yield
        return
    saved = (
        torch.are_deterministic_algorithms_enabled(),
        torch.backends.cudnn.benchmark,
        torch.backends.cudnn.deterministic,
    )
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0])
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved[1], saved[2]
