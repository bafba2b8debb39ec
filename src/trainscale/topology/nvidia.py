"""Parse ``nvidia-smi topo -m``: one row per GPU with its "CPU Affinity" and "NUMA Affinity" columns."""

from __future__ import annotations

import re

from trainscale.errors import ConfigError
from trainscale.topology.cpulist import parse_cpulist
from trainscale.topology.model import GpuInfo

_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # newer nvidia-smi underlines the header row
_GPU_ROW = re.compile(r"^GPU(\d+)\b")


def _cells(line: str) -> list[str]:
    return [c.strip() for c in _ANSI.sub("", line).rstrip("\n").split("\t")]


def parse_nvidia_topo(text: str) -> tuple[GpuInfo, ...]:
    """GPUs with their CPU and NUMA affinity from ``nvidia-smi topo -m`` output.

    The matrix is tab-separated: a header naming the columns (GPU0.., NICs, "CPU Affinity",
    "NUMA Affinity", sometimes "GPU NUMA ID"), then one row per device; only GPU rows matter.
    "N/A" (single-socket machines, VMs) leaves the field empty.
    """
    lines = text.splitlines()
    header_at = next((i for i, line in enumerate(lines) if "CPU Affinity" in _ANSI.sub("", line)), None)
    if header_at is None:
        raise ConfigError("nvidia-smi topo -m output has no 'CPU Affinity' column",
                          hint="pass the full output of `nvidia-smi topo -m`")
    header = _cells(lines[header_at])
    # The header starts with an empty cell above the row names; columns line up with the row's cells.
    if header and header[0] == "":
        header = header[1:]
    header = [h for h in header if h]
    cpu_col = header.index("CPU Affinity")
    numa_col = header.index("NUMA Affinity") if "NUMA Affinity" in header else None
    gpus: list[GpuInfo] = []
    for line in lines[header_at + 1:]:
        plain = _ANSI.sub("", line)
        match = _GPU_ROW.match(plain)
        if not match:
            if plain.strip().startswith("Legend"):
                break
            continue
        # nvidia-smi pads cells with spaces and sometimes doubles tabs; drop empties to realign.
        cells = [c for c in _cells(plain)[1:] if c != ""]
        if len(cells) <= cpu_col:
            raise ConfigError(f"nvidia-smi topo row for GPU{match.group(1)} has {len(cells)} cells, "
                              f"expected at least {cpu_col + 1}", hint="is the output complete and tab-separated?")
        cpu_text = cells[cpu_col]
        cpus = () if cpu_text.upper() == "N/A" else parse_cpulist(cpu_text)
        numa: int | None = None
        if numa_col is not None and numa_col < len(cells):
            first = cells[numa_col].split(",")[0].split("-")[0]
            numa = int(first) if first.isdigit() else None
        gpus.append(GpuInfo(index=int(match.group(1)), vendor="nvidia", cpus=cpus, numa_node=numa))
    return tuple(sorted(gpus, key=lambda g: g.index))
