"""The GPU suite: trainscale's GPU paths on real GPUs (NCCL, cuda:{local_rank}, CUDA events, GPU-local
CPU binding, DeepSpeed on GPUs). Run it with ``make test-gpu`` on a machine with GPUs and a CUDA (or
ROCm) build of torch (``TORCH_SPEC='torch>=2.4' make test-gpu`` makes the environment).

Without GPUs every test here is skipped (``torch.cuda.device_count() == 0``).

``TRAINSCALE_GPU_SUITE_ON_CPU=1`` is a developer aid for machines without GPUs: the tests then run on
CPU ranks over gloo, pretending two GPUs, and every assertion that only a GPU can satisfy (NCCL, one
GPU per rank, CUDA events, GPU-local cores) is skipped by ``needs_cuda``. It checks the test code
itself; it says nothing about GPUs.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from helpers.gpu import Gpus

ON_CPU = os.environ.get("TRAINSCALE_GPU_SUITE_ON_CPU") == "1"
GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


def pytest_collection_modifyitems(config, items):
    here = Path(__file__).resolve().parent
    for item in items:
        if here not in Path(str(item.path)).resolve().parents:
            continue
        item.add_marker(pytest.mark.gpu)
        if GPUS == 0 and not ON_CPU:
            item.add_marker(pytest.mark.skip(reason="no GPU visible (torch.cuda.device_count() == 0)"))
        elif ON_CPU and item.get_closest_marker("needs_cuda"):
            item.add_marker(pytest.mark.skip(reason="TRAINSCALE_GPU_SUITE_ON_CPU: this assertion needs a real GPU"))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: the GPU suite (tests/gpu), skipped without GPUs")
    config.addinivalue_line("markers", "needs_cuda: skipped in the TRAINSCALE_GPU_SUITE_ON_CPU developer mode")


@pytest.fixture(scope="session")
def gpus() -> Gpus:
    if ON_CPU:
        return Gpus(count=2, device="cpu", backend="gloo", on_cpu=True)
    return Gpus(count=GPUS, device="cuda", backend="nccl", on_cpu=False)
