"""Figures a study must not present as plain results: runs that other work on the same CPUs slowed down
(disturbed), and speedups above what the hardware allows (impossible: something other than the training
was measured, most often a disturbed baseline).

What each mark means and where it shows: docs/scaling.md, "Disturbed runs and impossible speedups".
"""

from __future__ import annotations

from trainscale.observe.sampler import OTHER_WORK_SHARE

SUPERLINEAR_LIMIT = 1.2
"""How far past the achievable speedup (bench/ideal.py's one ceiling) a measurement may go and still count.
Caches make strong scaling slightly superlinear when each rank's share of the work starts to fit (a few
percent to ~20% on CPUs); a 2-rank run 8.9x faster than 1 rank, seen under load, is not that."""

FIGURES = ("speedup", "efficiency", "efficiency_vs_achievable")


def disturbance(run: dict, cores: int | None) -> str | None:
    """Why this run's own timing is unreliable: other work on its CPUs (the node sampler's measurement,
    observe/sampler.py), or, where nothing was sampled, a machine already loaded past its cores."""
    share = run.get("other_cpu_share")
    if share is not None:
        return f"other work kept {share:.0%} of its CPUs busy" if share >= OTHER_WORK_SHARE else None
    load = run.get("load_before")
    if load is not None and cores and load > cores:
        return f"the machine's load average was {load:.1f} on {cores} cores as it started"
    return None


def assess(runs: list[dict], baseline_token: str, *, cores: int | None) -> None:
    """Mark every run of a study in place (after speedups and the achievable ideal are known). Marking again
    gives the same marks: the report marks a study whose maker did not."""
    for run in runs:
        for key, value in (run.get("rejected") or {}).items():
            if key in FIGURES:
                run[key] = value
        run["disturbed"] = disturbance(run, cores) if run.get("status") == "ok" else None
        run["speedup_disturbed"] = None
        run["rejected"] = None
    base = next((r for r in runs if r["config"] == baseline_token), None)
    if base is None:
        return
    for run in runs:
        if run is base or run.get("speedup") is None:
            continue
        causes = ([f"{run['label']}: {run['disturbed']}"] if run["disturbed"] else []) + (
            [f"the baseline {base['label']}: {base['disturbed']}"] if base["disturbed"] else []
        )
        run["speedup_disturbed"] = "; ".join(causes) or None
        if run.get("achievable_speedup") is None and run.get("compute_kind") != base.get("compute_kind"):
            continue  # a GPU against a CPU baseline: no hardware bound to hold it to
        # one ceiling: what this configuration's hardware allows (bench/ideal.py), linear where it is not known
        ceiling = run.get("achievable_speedup") or run["world_size"] / max(1, base["world_size"])
        limit = ceiling * SUPERLINEAR_LIMIT
        if run["speedup"] > limit:
            why = run["speedup_disturbed"] or "nothing else was seen on the machine: the clock or the work differed"
            run["rejected"] = {
                **{k: run.get(k) for k in FIGURES},
                "limit": limit,
                "reason": f"{run['speedup']:.2f}x measured, above the {ceiling:.2f}x its hardware "
                f"allows (+{SUPERLINEAR_LIMIT - 1:.0%} for cache effects: {why})",
            }
            for key in FIGURES:
                run[key] = None


def mark(run: dict, figure: str) -> str:
    """The suffix a figure of this run carries in a table: "*" when disturbed."""
    if figure in FIGURES:
        return "*" if run.get("speedup_disturbed") else ""
    return "*" if run.get("disturbed") else ""


REJECTED = "—(disturbed)"
"""What a table shows in place of a figure above what the hardware allows."""


def notes(study: dict) -> list[str]:
    """The lines under a table that explain its marks."""
    out = []
    for r in study["runs"]:
        if r.get("rejected"):
            out.append(
                f"{REJECTED} {r['label']}: {r['rejected']['reason']}: not a result. Measure again on a quiet machine."
            )
    disturbed = [r for r in study["runs"] if r.get("disturbed")]
    if disturbed:
        out.append(
            "* disturbed while it ran: "
            + ", ".join(f"{r['label']} ({r['disturbed']})" for r in disturbed)
            + ". Such a run's figures, and every speedup against it, are not what the training alone gives."
        )
    return out
