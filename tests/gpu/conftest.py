"""The GPU suite: trainscale's GPU paths on real GPUs (NCCL, cuda:{local_rank}, CUDA events, GPU-local
CPU binding, DeepSpeed on GPUs). Run it with ``make test-gpu`` on a machine with GPUs and a CUDA (or
ROCm) build of torch, or ``scripts/gpu-check.sh OUTDIR`` on a bare GPU machine (docs/gpu.md).

Without GPUs every test here is skipped (``torch.cuda.device_count() == 0``), and a run of this suite
alone (``pytest tests/gpu``, ``make test-gpu``) then fails with one line saying so: a green run with every
test skipped proved nothing. So does such a run on GPUs where every test was skipped. In a run of the whole
suite (``make test``) the skips stay skips.

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
HERE = Path(__file__).resolve().parent
_REASON = pytest.StashKey[str]()
_passed: list[str] = []  # this session's passed tests (reset by pytest_configure)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if HERE not in Path(str(item.path)).resolve().parents:
            continue
        item.add_marker(pytest.mark.gpu)
        if GPUS == 0 and not ON_CPU:
            item.add_marker(pytest.mark.skip(reason="no GPU visible (torch.cuda.device_count() == 0)"))
        elif ON_CPU and item.get_closest_marker("needs_cuda"):
            item.add_marker(pytest.mark.skip(reason="TRAINSCALE_GPU_SUITE_ON_CPU: this assertion needs a real GPU"))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: the GPU suite (tests/gpu), skipped without GPUs")
    config.addinivalue_line("markers", "needs_cuda: skipped in the TRAINSCALE_GPU_SUITE_ON_CPU developer mode")
    _passed.clear()


def pytest_runtest_logreport(report):
    if report.when == "call" and report.passed:
        _passed.append(report.nodeid)


def _only_this_suite(config) -> bool:
    """Whether this run asked for tests/gpu alone (by the command line's paths, which an xdist controller
    knows too, unlike the items its workers collect)."""
    paths = [(config.invocation_params.dir / arg.split("::")[0]).resolve() for arg in config.args]
    return bool(paths) and all(path == HERE or HERE in path.parents for path in paths)


def _proved_nothing(session) -> str | None:
    """Why a run of this suite alone that ended green proved nothing about GPUs, or None."""
    if ON_CPU or session.exitstatus != pytest.ExitCode.OK or not _only_this_suite(session.config):
        return None
    if GPUS == 0:
        build = (
            f"CUDA {torch.version.cuda}"
            if torch.version.cuda
            else f"ROCm {torch.version.hip}"
            if torch.version.hip
            else "a CPU-only build"
        )
        return (
            f"GPU suite FAILED: no GPU visible (torch {torch.__version__}, {build}), so every test was skipped; "
            f"run it where torch sees a GPU (scripts/gpu-check.sh OUTDIR on a bare GPU machine), or set "
            f"TRAINSCALE_GPU_SUITE_ON_CPU=1 to check the test code on CPU"
        )
    if not _passed:
        return (
            f"GPU suite FAILED: {GPUS} GPU(s) visible but no test passed (every one was skipped): "
            f"see the skip reasons above (-rs)"
        )
    return None


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):  # an xdist worker: its controller decides
        return
    reason = _proved_nothing(session)
    if reason:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
        session.config.stash[_REASON] = reason


def pytest_unconfigure(config):
    """The reason, printed last: below pytest's own summary line, where `make test-gpu` leaves it on screen."""
    reason = config.stash.get(_REASON, None)
    if reason:
        print(reason, flush=True)


@pytest.fixture(scope="session")
def gpus() -> Gpus:
    if ON_CPU:
        return Gpus(count=2, device="cpu", backend="gloo", on_cpu=True)
    return Gpus(count=GPUS, device="cuda", backend="nccl", on_cpu=False)
