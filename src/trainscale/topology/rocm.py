"""Parse ``rocm-smi --showtoponuma``: which NUMA node each AMD GPU (GCD) hangs off."""

from __future__ import annotations

import re

from trainscale.topology.model import GpuInfo

_LINE = re.compile(r"GPU\[(\d+)\]\s*:\s*\(Topology\)\s*Numa Node:\s*(-?\d+)", re.IGNORECASE)


def parse_rocm_toponuma(text: str) -> dict[int, int]:
    """GPU index -> NUMA node. A node of -1 (no NUMA information) is left out."""
    pairs = ((int(match.group(1)), int(match.group(2))) for match in _LINE.finditer(text))
    return {gpu: node for gpu, node in pairs if node >= 0}


def rocm_gpus(text: str, numa_cpus: dict[int, tuple[int, ...]]) -> tuple[GpuInfo, ...]:
    """GPUs from ``rocm-smi --showtoponuma`` with each GPU's CPUs taken from its NUMA node."""
    gpu_numa = parse_rocm_toponuma(text)
    indices = sorted({int(i) for i in re.findall(r"GPU\[(\d+)\]", text)})
    return tuple(
        GpuInfo(index=i, vendor="amd", numa_node=gpu_numa.get(i), cpus=numa_cpus.get(gpu_numa.get(i, -1), ()))
        for i in indices
    )
