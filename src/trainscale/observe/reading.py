"""The one reader of a run's records (observe/records.py): every command that turns a run's steps into figures
asks it — ``report`` (per-rank stats), ``bench`` (a study's runtime, steady step and sections, for a workload and a
plain script alike), ``plan`` (its calibration's and verification's steps, peaks), ``plan --tune`` (a trial's
rate) and ``selftest`` (its breakdown row). One rule for the steady steps, one for the sections of a step.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainscale.observe.records import metrics_dir, read_lines, read_run
from trainscale.observe.sampler import other_cpu_share

WARMUP = 2
"""Steps left out of a steady median: the first pay for the start-up's wait (the first collective waits for the
last rank), the allocator's, the thread pools' and the caches' warm-up."""
SHARES = ("data", "compute", "backward", "comm", "optimizer")
"""What a step record splits its time into (observe/steps.py); comm: exposed communication."""
SECTIONS = ("data", "compute", "communication", "optimizer", "other")
"""A study's sections of a step: compute is forward + backward's own work, communication the exposed part."""


def steady(steps: list) -> list:
    """The steps a median or a mean is taken over: after the warm-up (:data:`WARMUP`), after the first of a short
    run, the one step of a run of one."""
    if len(steps) > 2 * WARMUP:
        return steps[WARMUP:]
    return steps[1:] or steps


def step_records(records: list[dict]) -> list[dict]:
    return [r for r in records if r.get("kind") == "step" and r.get("step_s") is not None]


@dataclass
class RankStats:
    rank: int
    host: str
    steps: int
    step_median_s: float
    step_p90_s: float
    shares: dict[str, float]
    """Per steady step, seconds: data, compute (forward), backward, comm (exposed), optimizer, other."""
    samples_per_s: float | None
    tokens_per_s: float | None
    mfu: float | None
    peak_mem_bytes: int | None
    first_step_s: float | None = None
    """Its first step where :func:`steady` leaves it out of ``shares``: it holds the wait for every rank's start-up,
    compilation and first allocations."""
    total_s: float = 0.0
    """Its steps' seconds, all of them."""
    samples: int = 0
    steady_step_s: float | None = None
    """Median of its steady steps."""
    steady_samples: float | None = None
    """Mean samples of its steady steps (this rank's)."""
    steps_peak_mem_bytes: int | None = None
    loader_s: float | None = None
    """Per steady step, seconds in a DataLoader's ``__next__`` (inside ``data`` or ``between``); None without one."""


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))] if values else float("nan")


def rank_stats(rank: int, records: list[dict]) -> RankStats | None:
    meta = next((r for r in records if r.get("kind") == "meta"), {})
    steps = step_records(records)
    summary = next((r for r in reversed(records) if r.get("kind") == "summary"), {})
    if not steps:
        return None
    times = [float(r["step_s"]) for r in steps]
    total = sum(times)
    kept = steady(steps)
    shares = {k: sum(float(r.get(f"{k}_s") or 0.0) for r in kept) / len(kept) for k in SHARES}
    shares["other"] = max(0.0, sum(float(r["step_s"]) for r in kept) / len(kept) - sum(shares.values()))
    samples = sum(int(r.get("samples") or 0) for r in steps)
    tokens = sum(int(r.get("tokens") or 0) for r in steps)
    return RankStats(
        rank=rank,
        host=meta.get("node") or meta.get("host", "?"),
        steps=len(steps),
        step_median_s=statistics.median(times),
        step_p90_s=_pct(times, 0.9),
        shares=shares,
        samples_per_s=samples / total if samples and total else None,
        tokens_per_s=tokens / total if tokens and total else None,
        mfu=summary.get("mfu"),
        peak_mem_bytes=summary.get("peak_mem_bytes"),
        first_step_s=times[0] if len(kept) < len(steps) else None,
        total_s=total,
        samples=samples,
        steady_step_s=statistics.median(float(r["step_s"]) for r in kept),
        steady_samples=sum(int(r.get("samples") or 0) for r in kept) / len(kept),
        steps_peak_mem_bytes=summary.get("steps_peak_mem_bytes"),
        loader_s=sum(float(r.get("loader_s") or 0.0) for r in kept) / len(kept)
        if any("loader_s" in r for r in kept)
        else None,
    )


def ranks(run_dir: str | Path) -> list[RankStats]:
    """Each rank's stats, from its record file (ranks that recorded no step left out)."""
    found = read_run(run_dir)["ranks"] if metrics_dir(run_dir).is_dir() else {}
    return [s for s in (rank_stats(r, recs) for r, recs in found.items()) if s is not None]


def sections(stats: list[RankStats]) -> dict[str, float] | None:
    """Seconds of each section of a steady step (:data:`SECTIONS`), averaged over the ranks, and the shares of
    the step a study shows (``communication_fraction``, ``optimizer_fraction``)."""
    if not stats:
        return None

    def mean(key: str) -> float:
        return sum(s.shares[key] for s in stats) / len(stats)

    out = {
        "data": mean("data"),
        "compute": mean("compute") + mean("backward"),
        "communication": mean("comm"),
        "optimizer": mean("optimizer"),
        "other": mean("other"),
    }
    total = sum(out.values())
    for key in ("communication", "optimizer"):
        out[f"{key}_fraction"] = out[key] / total if total > 0 else 0.0
    return out


def run_timing(run_dir: str | Path) -> dict[str, Any] | None:
    """A run's timing as a study records it, from its step records (None where no rank recorded a step)."""
    return timing(ranks(run_dir))


def timing(stats: list[RankStats]) -> dict[str, Any] | None:
    """The training's seconds (the ranks' mean of their steps' sums), steps, samples (all ranks'), the mean steady
    step (``step_time_s``: the sections add up to it), the median one (``steady``: what one disturbed step does
    not move; the ranks' mean of their medians), rates, and the sections of a steady step."""
    if not stats:
        return None
    runtime = sum(s.total_s for s in stats) / len(stats)
    samples = sum(s.samples for s in stats)
    step = sum(s.steady_step_s for s in stats) / len(stats)
    per_step = sum(s.steady_samples or 0.0 for s in stats)
    return {
        "timed": "steps",
        "runtime_s": runtime,
        "steps": min(s.steps for s in stats),
        "samples": samples or None,
        "samples_per_s": samples / runtime if samples and runtime > 0 else None,
        "step_time_s": sum(sum(s.shares.values()) for s in stats) / len(stats),
        "steady": {
            "steps": len(steady(list(range(min(s.steps for s in stats))))),
            "step_time_s": step,
            "samples_per_s": per_step / step if per_step and step > 0 else None,
        },
        "breakdown": sections(stats),
    }


def other_work(run_dir: str | Path) -> float | None:
    """The share of the run's CPUs other work kept busy while it trained, from its node sampler's records
    (observe/sampler.py; None where sampling was off or took no sample)."""
    samples = [
        x
        for path in sorted(metrics_dir(run_dir).glob("node-*.jsonl"))
        for x in read_lines(path)
        if x.get("kind") == "sample"
    ]
    return other_cpu_share(samples)


def steps_peaks(run_dir: str | Path) -> list[int]:
    """Each rank's peak memory over its training steps, from its records' summary (observe/hooks.py)."""
    return [
        r["steps_peak_mem_bytes"]
        for path in sorted(metrics_dir(run_dir).glob("rank-*.jsonl"))
        for r in read_lines(path)
        if r.get("kind") == "summary" and r.get("steps_peak_mem_bytes")
    ]
