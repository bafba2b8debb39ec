"""Cluster profiles as data (TOML): loading, listing, and the CPU-GPU binding each profile implies (for the
SLURM renderer; inside a worker, ``trainscale.topology.bind_worker`` reads what it exports)."""

from __future__ import annotations

from trainscale.profiles.loader import (
    CONFIG_DIR_ENV,
    ProfileSource,
    list_profiles,
    load_profile,
    profile_from_dict,
    profile_from_file,
    user_profile_dir,
)
from trainscale.profiles.schema import ClusterProfile, ContainerSpec
from trainscale.topology.cpulist import format_cpulist
from trainscale.topology.model import Topology
from trainscale.topology.plan import BindingPlan, plan_binding, plan_cpu_only
from trainscale.topology.worker import PLAN_ENV

__all__ = [
    "CONFIG_DIR_ENV",
    "ClusterProfile",
    "ContainerSpec",
    "ProfileSource",
    "binding_plan",
    "list_profiles",
    "load_profile",
    "profile_from_dict",
    "profile_from_file",
    "slurm_cpu_bind",
    "user_profile_dir",
    "worker_bind_env",
]


def binding_plan(
    profile: ClusterProfile, local_world_size: int, topology: Topology | None = None
) -> BindingPlan | None:
    """The per-rank CPU sets this profile implies, or None when nothing can be planned before run time.

    ``binding = "map"`` plans from the profile's GPU -> cores map (LUMI); ``topology`` needs the node's
    detected topology (pass it, e.g. from ``detect_topology()`` on the node); ``none`` returns None.
    """
    reserved = profile.reserved_cores
    if profile.binding == "map":
        if profile.gpus_per_node == 0:
            usable = sorted({c for cores in profile.gpu_cores.values() for c in cores})
            return plan_cpu_only(usable, local_world_size, reserved=reserved, source=f"profile {profile.name} cores")
        return plan_binding(
            profile.gpu_cores, local_world_size, reserved=reserved, source=f"profile {profile.name} GPU -> cores map"
        )
    if profile.binding == "topology" and topology is not None:
        return plan_binding(
            topology,
            local_world_size,
            reserved=reserved,
            cpus_per_node=profile.cpus_per_node,
            source=f"profile {profile.name}, detected topology",
        )
    return None


def slurm_cpu_bind(profile: ClusterProfile, local_world_size: int) -> str:
    """The ``srun`` option for one task per GPU: masks for a map profile, ``none`` where workers bind themselves,
    empty to leave SLURM's default binding (``binding = "none"``), ``none`` also where the nodes share one
    machine's cores (``shares_cores``: SLURM's binding cannot lay out a task wider than the real cores)."""
    if profile.binding == "map":
        plan = binding_plan(profile, local_world_size)
        return plan.cpu_bind_option() if plan else ""
    if profile.binding == "topology":
        # The cores are only known on the node: SLURM must not pin first, the worker binds (bind_worker).
        return "--cpu-bind=none"
    return "--cpu-bind=none" if profile.shares_cores else ""


def worker_bind_env(profile: ClusterProfile, local_world_size: int) -> dict[str, str]:
    """Variables to export so each worker can bind itself (torchrun mode) or check its binding (srun mode)."""
    if profile.binding == "map":
        plan = binding_plan(profile, local_world_size)
        return {PLAN_ENV: plan.to_env()} if plan else {}
    if profile.binding == "topology":
        reserved = format_cpulist(profile.reserved_cores)
        return {PLAN_ENV: f"topology:{reserved}" if reserved else "topology"}
    return {}
