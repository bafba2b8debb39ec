"""What hardware a node has, as plain data: GPUs, NUMA nodes, CPUs. Built by the parsers, read by the planner."""

from __future__ import annotations

from dataclasses import dataclass, field

from trainscale.topology.cpulist import format_cpulist


@dataclass(frozen=True, kw_only=True)
class GpuInfo:
    """One GPU (or AMD GCD) as the node's tools see it."""

    index: int
    """Node-local index, as nvidia-smi / rocm-smi number it (PCI bus order)."""
    vendor: str = "none"
    """nvidia or amd."""
    cpus: tuple[int, ...] = ()
    """Cores close to this GPU (its NUMA node's cores); empty when the tool did not say."""
    numa_node: int | None = None
    """NUMA node the GPU hangs off; None when unknown."""


@dataclass(frozen=True, kw_only=True)
class NumaNode:
    """One NUMA node and the CPUs in it (sysfs ``nodeN/cpulist``)."""

    index: int
    """The N of ``/sys/devices/system/node/nodeN``."""
    cpus: tuple[int, ...]
    """Logical CPUs of this node, sorted."""


@dataclass(frozen=True, kw_only=True)
class Topology:
    """Everything detected about one node; every part may be empty when its tool is missing."""

    gpus: tuple[GpuInfo, ...] = ()
    """GPUs in node-local index order."""
    numa_nodes: tuple[NumaNode, ...] = ()
    """NUMA nodes in index order."""
    cpus: tuple[int, ...] = ()
    """Online logical CPUs of the node (not only those this process may use)."""
    core_of: dict[int, int] = field(default_factory=dict)
    """Logical CPU -> its physical core (lowest SMT sibling); empty when unknown."""
    sources: tuple[str, ...] = ()
    """What was read, and what was missing, in words (``nvidia-smi: not found``)."""

    def gpu_cores(self) -> dict[int, tuple[int, ...]]:
        """GPU index -> its close cores, falling back to its NUMA node's cores, then to every CPU."""
        by_node = {n.index: n.cpus for n in self.numa_nodes}
        return {gpu.index: tuple(gpu.cpus or by_node.get(gpu.numa_node, ()) or self.cpus) for gpu in self.gpus}

    def numa_of(self, cpu: int) -> int | None:
        return next((node.index for node in self.numa_nodes if cpu in node.cpus), None)

    def describe(self) -> list[str]:
        lines = [f"CPUs: {format_cpulist(self.cpus) or 'unknown'} ({len(self.cpus)})"]
        for node in self.numa_nodes:
            lines.append(f"NUMA node {node.index}: CPUs {format_cpulist(node.cpus)}")
        for gpu in self.gpus:
            numa = "?" if gpu.numa_node is None else gpu.numa_node
            lines.append(f"GPU {gpu.index} ({gpu.vendor}): NUMA {numa}, CPUs {format_cpulist(gpu.cpus) or '?'}")
        if not self.gpus:
            lines.append("GPUs: none found")
        return lines
