"""The achievable ideal: the speedup each configuration's hardware allows, next to the linear one.

Linear speedup assumes every added rank brings its own hardware; ranks that share cores (or nodes that are
one machine) cannot reach it. Why, and what counts as a compute unit: docs/scaling.md, "The achievable
ideal".
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Hardware:
    kind: str
    """gpu or cpu: speedups between kinds have no hardware ideal (a different machine part)."""
    units: float
    """GPUs, or CPU cores, the run can use."""
    describe: str
    ranks_per_core: float = 1.0
    """Threads the ranks run per core they share (above 1, ranks take turns on the cores)."""


def hardware(
    run: dict, *, cores_per_node: int, threads_per_rank: int | None = None, nodes_share_cores: bool = False
) -> Hardware:
    """What ``run`` (a study record: world_size, nodes, nproc_per_node, device) may use.

    ``threads_per_rank``: OMP threads each rank runs (None: trainscale's default, cores / ranks per node).
    A run that recorded its ``threads`` and ``usable_cpus`` (the CPUs its first node's ranks could run on) is taken at
    its word: a profile may claim more cores than a job's nodes let it use.
    ``nodes_share_cores``: every node is the same machine (the local test cluster).
    """
    nodes = max(1, int(run.get("nodes") or 1))
    per_node = int(run.get("nproc_per_node") or max(1, int(run["world_size"]) // nodes))
    if run.get("device", "cpu") != "cpu":
        return Hardware("gpu", float(run["world_size"]), f"{run['world_size']} GPU(s)")
    # what the run recorded its first node had beats what a profile or this machine says it would
    if run.get("usable_cpus"):
        cores_per_node = min(cores_per_node, int(run["usable_cpus"]))
    threads = int(run.get("threads") or 0) or threads_per_rank or max(1, cores_per_node // per_node)
    on_node = min(cores_per_node, per_node * threads)
    cores = on_node if nodes_share_cores else on_node * nodes
    where = "the same machine" if nodes_share_cores and nodes > 1 else f"{nodes} node(s)"
    threads_on_machine = per_node * threads * (nodes if nodes_share_cores else 1)
    return Hardware(
        "cpu",
        float(cores),
        f"{cores} core(s) on {where} ({per_node} rank(s) x {threads} thread(s) per node)",
        ranks_per_core=max(1.0, threads_on_machine / cores_per_node),
    )


def ceiling(run: Hardware, world: int, base: Hardware, base_world: int) -> float:
    """The most speedup ``run``'s hardware allows against the baseline's: the one ceiling a study holds its
    figures to. GPUs: their count's ratio. CPU cores: the run's cores against one core per baseline rank (a
    baseline rank runs at least at one core's speed, however well its threads scale), and never above linear:
    4 ranks on 2 shared cores allow 2x against 1 rank, not 4x; 2 ranks on the 2 cores a threaded 1-rank baseline
    also used allow up to 2x (as far as its threads fell short of 2 cores)."""
    linear = world / max(1, base_world)
    if run.kind == "gpu":
        return run.units / base.units
    return min(linear, run.units / max(1, base_world))


def add_achievable(
    runs: list[dict],
    baseline: str,
    *,
    cores_per_node: int,
    threads_per_rank: int | None = None,
    nodes_share_cores: bool = False,
) -> str | None:
    """Fill each run's ``hardware``, ``achievable_speedup`` and ``efficiency_vs_achievable``; returns a sentence
    when configurations share their hardware (shown under the table), else None."""
    units = {
        r["config"]: hardware(
            r, cores_per_node=cores_per_node, threads_per_rank=threads_per_rank, nodes_share_cores=nodes_share_cores
        )
        for r in runs
    }
    base = units.get(baseline)
    base_world = next((int(r["world_size"]) for r in runs if r["config"] == baseline), 1)
    for run in runs:
        hw = units[run["config"]]
        run["hardware"] = hw.describe
        run["compute_units"], run["compute_kind"], run["ranks_per_core"] = hw.units, hw.kind, hw.ranks_per_core
        same_kind = base is not None and hw.kind == base.kind and base.units > 0
        run["achievable_speedup"] = ceiling(hw, int(run["world_size"]), base, base_world) if same_kind else None
        speedup = run.get("speedup")
        run["efficiency_vs_achievable"] = (
            speedup / run["achievable_speedup"] if speedup is not None and run["achievable_speedup"] else None
        )
    shared = [
        r
        for r in runs
        if r["world_size"] > 1
        and r["achievable_speedup"] is not None  # so base is known
        and r["achievable_speedup"] < r["world_size"] / max(1, base_world)
    ]
    if not shared:
        return None
    names = ", ".join(f"{r['label']} ({r['achievable_speedup']:.2f}x)" for r in shared)
    return (
        f"These configurations run more ranks than cores against the baseline's one core per rank: linear "
        f"speedup is out of reach, and the most their cores allow is {names}. Efficiency is given against "
        f"both."
    )
