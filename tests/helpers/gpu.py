"""Helpers of the GPU suite (tests/gpu)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch


@dataclass(frozen=True)
class Gpus:
    """What the tests run on: real GPUs, or CPU ranks standing in for them (``on_cpu``)."""

    count: int
    device: str
    """What the ranks pass as ``device``: cuda, or cpu in the developer mode."""
    backend: str
    on_cpu: bool

    def need(self, n: int) -> None:
        if self.count < n:
            pytest.skip(f"needs {n} GPUs, this machine has {self.count}")


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without launcher variables a test could inherit."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            (
                "RANK",
                "LOCAL_RANK",
                "WORLD_SIZE",
                "MASTER_",
                "SLURM_",
                "TRAINSCALE_FAULT",
                "TRAINSCALE_CPU_BIND",
                "TORCHELASTIC",
            )
        )
    }
    env.update(extra)
    return env


def trainscale(cwd: Path, *argv: str, timeout: float = 600, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainscale", *argv],
        cwd=cwd,
        env=clean_env(**extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def gpu_id(index: int) -> str:
    """A GPU's identity as the driver sees it (the UUID; PCI bus on torch builds without it)."""
    props = torch.cuda.get_device_properties(index)
    return str(getattr(props, "uuid", None) or f"{props.name} {getattr(props, 'pci_bus_id', index)}")
