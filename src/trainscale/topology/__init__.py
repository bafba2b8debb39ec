"""What hardware? Parse tool output and sysfs into data, plan CPU sets per local rank; ``apply`` binds.

Public API::

    parse_cpulist("1-7,9-15") / format_cpulist(cores) / cores_to_mask(cores) / mask_to_cores("0xfe")
    parse_nvidia_topo(text) / parse_rocm_toponuma(text) / read_numa_nodes(root)
    detect_topology(root="/") -> Topology
    plan_binding(gpu_cores | topology, local_world_size, reserved=..., cpus_per_node=...) -> BindingPlan
    plan_cpu_only(usable, local_world_size, reserved=...) -> BindingPlan
    bind_worker(local_rank, local_world_size) -> BindingReport   (inside a worker; reads TRAINSCALE_CPU_BIND)
"""

from trainscale.topology.apply import apply_cpu_binding, current_affinity, far_from_gpu
from trainscale.topology.cpulist import cores_to_mask, format_cpulist, mask_to_cores, parse_cpulist
from trainscale.topology.detect import detect_topology
from trainscale.topology.model import GpuInfo, NumaNode, Topology
from trainscale.topology.nvidia import parse_nvidia_topo
from trainscale.topology.plan import BindingPlan, RankBinding, plan_binding, plan_cpu_only
from trainscale.topology.rocm import parse_rocm_toponuma, rocm_gpus
from trainscale.topology.sysfs import read_core_of, read_numa_nodes, read_online_cpus, read_pci_gpus
from trainscale.topology.worker import PLAN_ENV, BindingReport, bind_worker, plan_from_env

__all__ = [
    "PLAN_ENV", "BindingPlan", "BindingReport", "GpuInfo", "NumaNode", "RankBinding", "Topology",
    "apply_cpu_binding", "bind_worker", "cores_to_mask", "current_affinity", "detect_topology", "far_from_gpu",
    "format_cpulist", "mask_to_cores", "parse_cpulist", "parse_nvidia_topo", "parse_rocm_toponuma",
    "plan_binding", "plan_cpu_only", "plan_from_env", "read_core_of", "read_numa_nodes", "read_online_cpus",
    "read_pci_gpus", "rocm_gpus",
]
