"""Read NUMA nodes, CPUs, SMT siblings and PCI GPUs from sysfs under a root path (tests pass a fake tree)."""

from __future__ import annotations

import re
from pathlib import Path

from trainscale.errors import ConfigError
from trainscale.topology.cpulist import parse_cpulist
from trainscale.topology.model import GpuInfo, NumaNode

_VENDORS = {"0x10de": "nvidia", "0x1002": "amd"}
# PCI classes of GPUs: VGA, 3D controller, display controller, processing accelerator.
_GPU_CLASSES = ("0x0300", "0x0302", "0x0380", "0x1200")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cpulist_or_empty(path: Path) -> tuple[int, ...]:
    text = _read(path)
    if not text:
        return ()
    try:
        return parse_cpulist(text)
    except ConfigError:
        return ()


def read_numa_nodes(root: str | Path = "/") -> tuple[NumaNode, ...]:
    """NUMA nodes with CPUs, from ``sys/devices/system/node/nodeN/cpulist``; memory-only nodes are skipped."""
    base = Path(root) / "sys/devices/system/node"
    nodes = []
    for entry in base.glob("node[0-9]*"):
        match = re.fullmatch(r"node(\d+)", entry.name)
        cpus = _cpulist_or_empty(entry / "cpulist")
        if match and cpus:
            nodes.append(NumaNode(index=int(match.group(1)), cpus=cpus))
    return tuple(sorted(nodes, key=lambda n: n.index))


def read_online_cpus(root: str | Path = "/") -> tuple[int, ...]:
    """Online logical CPUs (``sys/devices/system/cpu/online``); empty when unreadable."""
    return _cpulist_or_empty(Path(root) / "sys/devices/system/cpu/online")


def read_core_of(root: str | Path = "/", cpus: tuple[int, ...] = ()) -> dict[int, int]:
    """Logical CPU -> its physical core, named by the lowest CPU in ``thread_siblings_list``."""
    base = Path(root) / "sys/devices/system/cpu"
    result: dict[int, int] = {}
    for cpu in cpus:
        siblings = _cpulist_or_empty(base / f"cpu{cpu}/topology/thread_siblings_list")
        if siblings:
            result[cpu] = siblings[0]
    return result


def read_pci_gpus(root: str | Path = "/") -> tuple[GpuInfo, ...]:
    """NVIDIA/AMD GPUs from ``sys/bus/pci/devices`` in PCI bus order, with ``local_cpulist`` and ``numa_node``.

    Bus order is the order nvidia-smi and rocm-smi number GPUs in (CUDA_DEVICE_ORDER=PCI_BUS_ID).
    """
    base = Path(root) / "sys/bus/pci/devices"
    found = []
    for dev in sorted(base.glob("*")):
        vendor = _VENDORS.get((_read(dev / "vendor") or "").lower())
        pci_class = (_read(dev / "class") or "").lower()
        if vendor is None or not pci_class.startswith(_GPU_CLASSES):
            continue
        numa_text = _read(dev / "numa_node")
        numa = int(numa_text) if numa_text and numa_text.lstrip("-").isdigit() and int(numa_text) >= 0 else None
        found.append((vendor, numa, _cpulist_or_empty(dev / "local_cpulist")))
    return tuple(GpuInfo(index=i, vendor=v, numa_node=n, cpus=c) for i, (v, n, c) in enumerate(found))
