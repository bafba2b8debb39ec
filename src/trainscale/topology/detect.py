"""Find out what this node has: GPUs from nvidia-smi, rocm-smi or sysfs, NUMA nodes and CPUs from sysfs.

Never raises for a missing or failing tool: what could not be read is noted in ``Topology.sources``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from trainscale.errors import ConfigError
from trainscale.topology.model import GpuInfo, Topology
from trainscale.topology.nvidia import parse_nvidia_topo
from trainscale.topology.rocm import rocm_gpus
from trainscale.topology.sysfs import read_core_of, read_numa_nodes, read_online_cpus, read_pci_gpus

Runner = Callable[[list[str]], "str | None"]


def run_tool(argv: list[str], timeout: float = 15.0) -> str | None:
    """stdout of a tool, or None when it is not installed, fails or hangs."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _gpus_from_tools(run: Runner, numa_cpus: dict[int, tuple[int, ...]], notes: list[str]) -> tuple[GpuInfo, ...]:
    text = run(["nvidia-smi", "topo", "-m"])
    if text is None:
        notes.append("nvidia-smi: not available")
    else:
        try:
            gpus = parse_nvidia_topo(text)
            notes.append(f"nvidia-smi topo -m: {len(gpus)} GPU(s)")
            if gpus:
                return gpus
        except ConfigError as exc:
            notes.append(f"nvidia-smi topo -m: unreadable ({exc.message})")
    text = run(["rocm-smi", "--showtoponuma"])
    if text is None:
        notes.append("rocm-smi: not available")
    else:
        gpus = rocm_gpus(text, numa_cpus)
        notes.append(f"rocm-smi --showtoponuma: {len(gpus)} GPU(s)")
        if gpus:
            return gpus
    return ()


def _fill_cpus(
    gpus: tuple[GpuInfo, ...], numa_cpus: dict[int, tuple[int, ...]], pci: tuple[GpuInfo, ...]
) -> tuple[GpuInfo, ...]:
    """rocm-smi gives only NUMA nodes and some nvidia-smi builds print N/A: fill CPUs from NUMA, then sysfs PCI."""
    by_index = {g.index: g for g in pci} if len(pci) == len(gpus) else {}
    filled = []
    for gpu in gpus:
        if gpu.cpus:
            filled.append(gpu)
            continue
        pci_gpu = by_index.get(gpu.index)
        node = gpu.numa_node if gpu.numa_node is not None else (pci_gpu.numa_node if pci_gpu else None)
        cpus = (numa_cpus.get(node, ()) if node is not None else ()) or (pci_gpu.cpus if pci_gpu else ())
        filled.append(replace(gpu, numa_node=node, cpus=cpus))
    return tuple(filled)


def detect_topology(root: str | Path = "/", *, run: Runner | None = None) -> Topology:
    """The node's topology. ``root`` and ``run`` let tests use a fake sysfs tree and captured tool output."""
    notes: list[str] = []
    numa = read_numa_nodes(root)
    notes.append(f"sysfs: {len(numa)} NUMA node(s)" if numa else "sysfs: no NUMA information")
    cpus = read_online_cpus(root) or tuple(sorted({c for n in numa for c in n.cpus}))
    if not cpus and Path(root) == Path("/"):
        cpus = tuple(range(os.cpu_count() or 1))
    numa_cpus = {n.index: n.cpus for n in numa}
    gpus = _gpus_from_tools(run or run_tool, numa_cpus, notes)
    if not gpus:
        gpus = read_pci_gpus(root)
        if gpus:
            notes.append(f"sysfs PCI: {len(gpus)} GPU(s)")
    if gpus and any(not g.cpus for g in gpus):
        gpus = _fill_cpus(gpus, numa_cpus, read_pci_gpus(root))
    return Topology(gpus=gpus, numa_nodes=numa, cpus=cpus, core_of=read_core_of(root, cpus), sources=tuple(notes))
