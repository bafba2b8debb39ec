"""Inside a worker: pick this rank's CPU set from the plan handed down by the launcher, apply it, report.

The launcher (batch script, local launcher) says what to do in ``TRAINSCALE_CPU_BIND``:
  unset / ``none``        leave the affinity alone;
  ``topology[:RESERVED]`` detect this node and plan (GPU-local cores first, RESERVED cpulist excluded);
  ``0:49-55/1:57-63/..``  a ready plan, ``GPU:cores`` per local rank (``BindingPlan.to_env()``);
  ``0-3;4-7``             bare core lists per local rank (CPU-only ranks).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from trainscale.errors import ConfigError
from trainscale.topology.apply import apply_cpu_binding, current_affinity, far_from_gpu
from trainscale.topology.cpulist import format_cpulist, parse_cpulist
from trainscale.topology.detect import detect_topology
from trainscale.topology.model import Topology
from trainscale.topology.plan import BindingPlan, gpu_order, plan_binding, visible_gpus

PLAN_ENV = "TRAINSCALE_CPU_BIND"


@dataclass(frozen=True, kw_only=True)
class BindingReport:
    """What one rank asked for, what it got, and whether that is far from its GPU."""

    local_rank: int
    """Rank within the node."""
    gpu: int | None
    """GPU this rank drives per the plan; None for CPU-only."""
    requested: tuple[int, ...]
    """Cores the plan gave this rank (empty: no binding asked)."""
    actual: tuple[int, ...]
    """Affinity in force after binding."""
    applied: bool
    """True when the affinity was changed."""
    far: bool
    """True when most of ``actual`` is not close to the rank's GPU."""
    note: str = ""
    """Why nothing was applied, or what was adjusted."""

    def describe(self) -> str:
        gpu = "" if self.gpu is None else f" (GPU {self.gpu})"
        text = f"local rank {self.local_rank}{gpu}: CPUs {format_cpulist(self.actual)}"
        if self.applied:
            text += f" bound from plan {format_cpulist(self.requested)}"
        if self.note:
            text += f"; {self.note}"
        if self.far:
            text += "; WARNING: most of these cores are far from this rank's GPU (slow host<->GPU copies)"
        return text


def plan_from_env(
    value: str,
    local_world_size: int,
    detect: Callable[[], Topology] = detect_topology,
    *,
    environ: Mapping[str, str] | None = None,
    local_rank: int = 0,
) -> BindingPlan | None:
    """The plan ``TRAINSCALE_CPU_BIND`` describes for this node, or None for no binding. A detected
    plan maps local rank r to the r-th GPU *visible* here (``environ``'s *_VISIBLE_DEVICES)."""
    value = value.strip()
    if value in ("", "none"):
        return None
    if value == "topology" or value.startswith("topology:"):
        reserved = parse_cpulist(value.partition(":")[2])
        topology = detect()
        order = None
        if topology.gpus and environ is not None:
            node = [g.index for g in topology.gpus]
            order = gpu_order(visible_gpus(environ, node), node, local_rank, local_world_size)
        return plan_binding(topology, local_world_size, reserved=reserved, gpu_order=order)
    plan = BindingPlan.from_env(value, source=PLAN_ENV)
    if plan.local_world_size != local_world_size:
        raise ConfigError(
            f"{PLAN_ENV} plans {plan.local_world_size} local ranks but this node runs {local_world_size}",
            hint="render the job again with the same GPUs per node as the launch",
        )
    return plan


def bind_worker(
    local_rank: int,
    local_world_size: int,
    *,
    environ: Mapping[str, str] | None = None,
    plan: BindingPlan | None = None,
    detect: Callable[[], Topology] = detect_topology,
) -> BindingReport:
    """Apply this rank's CPU set (from ``plan`` or ``TRAINSCALE_CPU_BIND``) and report the outcome.

    Binding is an optimisation, so a plan that does not fit this node never stops training: the
    report's ``note`` says what was wrong and the affinity is left as it was.
    """
    environ = os.environ if environ is None else environ
    before = current_affinity()
    unbound = dict(
        local_rank=local_rank, gpu=None, requested=(), actual=tuple(sorted(before)), applied=False, far=False
    )
    try:
        plan = plan or plan_from_env(
            environ.get(PLAN_ENV, ""), local_world_size, detect, environ=environ, local_rank=local_rank
        )
    except ConfigError as exc:
        return BindingReport(**unbound, note=f"not bound: {exc.message}")
    if plan is None:
        return BindingReport(**unbound)
    if local_rank >= plan.local_world_size:
        return BindingReport(**unbound, note=f"not bound: the plan covers {plan.local_world_size} local ranks")
    rank = plan.ranks[local_rank]
    allowed = [c for c in rank.cpus if c in before]
    if not allowed:
        return BindingReport(
            local_rank=local_rank,
            gpu=rank.gpu,
            requested=rank.cpus,
            actual=tuple(sorted(before)),
            applied=False,
            far=rank.gpu is not None and far_from_gpu(before, rank.cpus),
            note=f"not bound: planned CPUs {rank.cpulist} are outside this process's allowed "
            f"CPUs {format_cpulist(before)} (the job did not get them)",
        )
    note = (
        f"only {format_cpulist(allowed)} of the planned CPUs are allowed in this job"
        if len(allowed) < len(rank.cpus)
        else ""
    )
    actual = apply_cpu_binding(allowed)
    return BindingReport(
        local_rank=local_rank,
        gpu=rank.gpu,
        requested=rank.cpus,
        actual=tuple(sorted(actual)),
        applied=actual != before,
        far=rank.gpu is not None and far_from_gpu(actual, rank.cpus),
        note=note,
    )
