"""What hardware? Parse tool output and sysfs into data, plan CPU sets per local rank; ``apply`` binds."""

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
    "PLAN_ENV",
    "BindingPlan",
    "BindingReport",
    "GpuInfo",
    "NumaNode",
    "RankBinding",
    "Topology",
    "apply_cpu_binding",
    "bind_worker",
    "cores_to_mask",
    "current_affinity",
    "detect_topology",
    "far_from_gpu",
    "format_cpulist",
    "mask_to_cores",
    "parse_cpulist",
    "parse_nvidia_topo",
    "parse_rocm_toponuma",
    "plan_binding",
    "plan_cpu_only",
    "plan_from_env",
    "read_core_of",
    "read_numa_nodes",
    "read_online_cpus",
    "read_pci_gpus",
    "rocm_gpus",
]
