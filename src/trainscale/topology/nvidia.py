"""Parse ``nvidia-smi topo -m``: one row per GPU with its "CPU Affinity" and "NUMA Affinity" columns, and
the GPU-to-GPU link matrix (``NV12``: twelve NVLinks; ``PIX``/``PXB``/``PHB``/``NODE``/``SYS``: PCIe paths)."""

from __future__ import annotations

import re

from trainscale.errors import ConfigError
from trainscale.topology.cpulist import parse_cpulist
from trainscale.topology.model import GpuInfo

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # newer nvidia-smi underlines the header row
_GPU_ROW = re.compile(r"^GPU(\d+)\b")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in _ANSI.sub("", line).rstrip("\n").split("\t")]


def _matrix(text: str) -> tuple[list[str], list[tuple[int, list[str]]]]:
    """``nvidia-smi topo -m``'s column names and its GPU rows (index, cells), up to the legend."""
    lines = [_ANSI.sub("", line) for line in text.splitlines()]
    header_at = next((i for i, line in enumerate(lines) if "CPU Affinity" in line), None)
    if header_at is None:
        raise ConfigError(
            "nvidia-smi topo -m output has no 'CPU Affinity' column",
            hint="pass the full output of `nvidia-smi topo -m`",
        )
    rows = []
    for line in lines[header_at + 1 :]:
        match = _GPU_ROW.match(line)
        if not match:
            if line.strip().startswith("Legend"):
                break
            continue
        # nvidia-smi pads cells with spaces and sometimes doubles tabs; drop empties to realign.
        rows.append((int(match.group(1)), [c for c in _cells(line)[1:] if c != ""]))
    # The header starts with an empty cell above the row names; columns line up with the rows' cells.
    return [h for h in _cells(lines[header_at]) if h], rows


def parse_nvidia_topo(text: str) -> tuple[GpuInfo, ...]:
    """GPUs with their CPU and NUMA affinity from ``nvidia-smi topo -m`` output.

    The matrix is tab-separated: a header naming the columns (GPU0.., NICs, "CPU Affinity",
    "NUMA Affinity", sometimes "GPU NUMA ID"), then one row per device; only GPU rows matter.
    "N/A" (single-socket machines, VMs) leaves the field empty.
    """
    header, rows = _matrix(text)
    cpu_col = header.index("CPU Affinity")
    numa_col = header.index("NUMA Affinity") if "NUMA Affinity" in header else None
    gpus: list[GpuInfo] = []
    for index, cells in rows:
        if len(cells) <= cpu_col:
            raise ConfigError(
                f"nvidia-smi topo row for GPU{index} has {len(cells)} cells, expected at least {cpu_col + 1}",
                hint="is the output complete and tab-separated?",
            )
        cpu_text = cells[cpu_col]
        cpus = () if cpu_text.upper() == "N/A" else parse_cpulist(cpu_text)
        numa: int | None = None
        if numa_col is not None and numa_col < len(cells):
            first = cells[numa_col].split(",")[0].split("-")[0]
            numa = int(first) if first.isdigit() else None
        gpus.append(GpuInfo(index=index, vendor="nvidia", cpus=cpus, numa_node=numa))
    return tuple(sorted(gpus, key=lambda g: g.index))


def parse_nvidia_links(text: str) -> dict[tuple[int, int], str]:
    """(GPU i, GPU j) -> the link between them as ``nvidia-smi topo -m`` names it, for i != j."""
    header, rows = _matrix(text)
    gpu_columns = {i: int(name[3:]) for i, name in enumerate(header) if _GPU_ROW.match(name)}
    return {
        (index, other): cells[col]
        for index, cells in rows
        for col, other in gpu_columns.items()
        if col < len(cells) and other != index
    }


NVLINK_GBPS_PER_LINK = 25.0
"""One NVLink's bandwidth in one direction, GB/s (NVLink 2, 3 and 4 alike: V100, A100, H100)."""


def nvlink_count(link: str) -> int:
    """``NV12`` -> 12; a PCIe path (PIX, PXB, PHB, NODE, SYS) -> 0."""
    return int(link[2:]) if link.startswith("NV") and link[2:].isdigit() else 0


def expected_busbw_gbps(links: dict[tuple[int, int], str], gpus: list[int]) -> tuple[float | None, str]:
    """What an all-reduce over ``gpus`` should reach at least by their links: (GB/s or None, why). NVLink
    between every pair: the weakest pair's links x 25 GB/s (a ring runs at its slowest hop); any PCIe pair:
    no expectation (PCIe and host bridges vary too much between machines to judge)."""
    pairs = [(a, b) for a in gpus for b in gpus if a != b and (a, b) in links]
    if not pairs:
        return None, "no GPU-to-GPU links known"
    weakest = min(pairs, key=lambda p: nvlink_count(links[p]))
    n = nvlink_count(links[weakest])
    if n == 0:
        return None, f"GPU{weakest[0]}-GPU{weakest[1]} over PCIe ({links[weakest]}): no NVLink expectation"
    return n * NVLINK_GBPS_PER_LINK, f"NVLink between every pair (weakest {links[weakest]}: {n} x 25 GB/s)"
