"""The report's first lines: was this job efficient, and if not, why — in words, worst first."""

from __future__ import annotations

import math
import statistics

from trainscale.bench.results import busy_warning, plan_check, suggestions
from trainscale.findings import Finding
from trainscale.observe.sampler import OTHER_WORK_SHARE, other_cpu_share
from trainscale.report.gather import Gathered

LOW_GPU_UTIL = 60.0
HIGH_COMM_SHARE = 0.30
HIGH_DATA_SHARE = 0.15
LOW_CPU_EFFICIENCY = 0.5
STARTUP_WAIT_S = 2.0
STARTUP_RATIO = 10.0
"""A first step this much longer than the steady mean step (and over STARTUP_WAIT_S) is the start-up's wait."""
LEVELS = ("problem", "note", "good")
"""A finding's levels, in the order a verdict lists them."""


def findings(g: Gathered) -> list[Finding]:
    out: list[Finding] = []
    diagnosis = g.extra.get("diagnosis")
    live = [e for e in g.events if e.get("kind") == "straggler"]  # named while training: the same rule, its own
    named = bool(live)  # windows; the last names its place in the code too, once the late rank sampled it
    later = diagnosis.straggler if diagnosis is not None and diagnosis.straggler is not None else None
    taking_turns = diagnosis.turns if diagnosis is not None else None
    if taking_turns is not None:  # the steps aligned: no one rank was last most of the time (the live watch's
        named = False  # windows cannot align the ranks' steps): no straggler, the ranks take turns
        out.append(Finding("problem", f"stragglers in turns: {taking_turns.describe()}"))
    if named:  # the records have the place when the run ended before the watch read it
        text = later.describe() if later and later.place and not live[-1].get("place") else live[-1]["message"]
        out.append(Finding("problem", f"straggler: {text}"))
    for event in g.events:
        if event.get("kind") == "interconnect" and event.get("level") in ("warning", "error"):
            out.append(Finding("problem", f"network: {event['message']}"))
        elif event.get("kind") == "hang":
            out.append(Finding("problem", f"hang: {event['message']} (the ranks' records below end where they waited)"))
        elif event.get("kind") == "node_lost":  # the job healed itself (launch/slurm/healing.py)
            out.append(Finding("note", str(event.get("message"))))
    if not named and diagnosis is not None and diagnosis.straggler is not None:
        named = True
        out.append(Finding("problem", f"straggler: {diagnosis.straggler.describe()}"))
    if g.ranks:
        # shares of the mean step after the first, as the rank table shows them: a verdict names a figure the
        # tables show (a rank waiting for another's start-up, in the first step, is not communication)
        comm = statistics.median(_share(r, "comm") for r in g.ranks)
        late = diagnosis.straggler.rank if diagnosis is not None and diagnosis.straggler is not None else None
        data = statistics.median(_share(r, "data") for r in g.ranks if r.rank != late or len(g.ranks) == 1)
        if comm >= HIGH_COMM_SHARE and not named and taking_turns is None:  # a straggler's wait: said above
            # no "sharded strategy" here: sharding saves memory and moves as many bytes as an all-reduce, or more
            out.append(
                Finding(
                    "problem",
                    f"communication takes {comm:.0%} of the step while the ranks arrive "
                    "together: larger per-rank batch, gradient accumulation or overlap (docs/scaling.md)",
                )
            )
        if data >= HIGH_DATA_SHARE and not (taking_turns and {"data", "loader"} & set(taking_turns.phase.split("+"))):
            out.append(Finding("problem", _data_wait(g, data, late)))
        started = [
            r
            for r in g.ranks
            if r.first_step_s is not None
            and r.first_step_s > max(STARTUP_WAIT_S, STARTUP_RATIO * sum(r.shares.values()))
        ]
        if started:
            slowest = max(started, key=lambda r: r.first_step_s)
            out.append(
                Finding(
                    "note",
                    f"the first step took up to {slowest.first_step_s:.1f} s (rank {slowest.rank}): "
                    "the ranks' start-up (the first collective waits for the last rank to arrive: "
                    "imports, trackers, data); it is left out of the shares below",
                )
            )
        mfus = [r.mfu for r in g.ranks if r.mfu is not None]
        if mfus:
            micro = diagnosis.micro_batches if diagnosis is not None else None
            out.append(
                Finding(
                    "note",
                    f"model FLOPs utilisation {statistics.median(mfus):.1%} of the devices' peak"
                    + (f", counting the {micro} micro-batches of each optimizer step" if micro and micro > 1 else ""),
                )
            )
    utils = [
        gpu.get("util_pct")
        for samples in g.samples.values()
        for s in samples
        for gpu in s.get("gpus", [])
        if gpu.get("util_pct") is not None
    ]
    if utils:
        mean = math.fsum(utils) / len(utils)  # statistics.mean's exact sum took a second at 1,024 ranks
        out.append(
            Finding(
                "problem" if mean < LOW_GPU_UTIL else "good",
                f"GPU utilisation averaged {mean:.0f}%"
                + (" (low: the GPUs waited for data, the CPU or communication)" if mean < LOW_GPU_UTIL else ""),
            )
        )

    for host, samples in g.samples.items():
        share = other_cpu_share(samples)
        if share is not None and share >= OTHER_WORK_SHARE:
            out.append(
                Finding(
                    "problem",
                    f"other work kept {share:.0%} of the ranks' CPUs on {host} busy: every rank "
                    "there ran slower for it (another job or process on the same cores; "
                    "an exclusive allocation or a quiet node avoids it)",
                )
            )
    acct = g.accounting or {}
    if acct.get("cpu_efficiency") is not None and acct["cpu_efficiency"] < LOW_CPU_EFFICIENCY and not utils:
        out.append(
            Finding(
                "note",
                f"CPU efficiency {acct['cpu_efficiency']:.0%} of the allocated cores (sacct): "
                "fewer cores would do, or more threads per rank",
            )
        )
    suggestion = _strategy_advice(g)
    if suggestion:
        out.append(Finding("problem", suggestion))
    if not any(f.level == "problem" for f in out) and g.ranks:
        out.insert(0, Finding("good", "no problem found: ranks in step, communication and data wait small"))
    return sorted(out, key=lambda f: LEVELS.index(f.level))


def _data_wait(g: Gathered, data: float, late: int | None) -> str:
    """The data wait in words: the DataLoader advised on only where its batches took most of it."""
    ranks = [r for r in g.ranks if r.rank != late or len(g.ranks) == 1]
    fed = [r.loader_s / sum(r.shares.values()) for r in ranks if r.loader_s is not None and sum(r.shares.values())]
    loader = statistics.median(fed) if fed else None
    if loader is not None and loader >= 0.5 * data:
        return (
            f"waiting for data takes {data:.0%} of the step, the DataLoader's batches {loader:.0%}: more DataLoader "
            "workers (within the rank's CPUs), pinned memory, data on fast storage"
        )
    return f"host work before each forward takes {data:.0%} of the step: the script's own work between steps" + (
        f"; not the DataLoader, whose batches took {loader:.0%}" if loader is not None else "; no DataLoader was seen"
    )


def _share(r, part: str) -> float:
    step = sum(r.shares.values())
    return r.shares[part] / step if step > 0 else 0.0


def _strategy_advice(g: Gathered) -> str | None:
    """The strategy's own suggestion for the run the report is about (a study's largest run): e.g. ZeRO-1
    when every DDP rank spends a large share of the step on the whole optimizer step."""
    runs = [r for r in (g.study or {}).get("runs", []) if r.get("status") == "ok" and r.get("strategy")]
    if not runs:
        return None
    from trainscale.strategies import advice  # imports torch: only a study's report pays for it  # noqa: PLC0415 (torch-free module)

    run = max(runs, key=lambda r: r["world_size"])
    share = (run.get("breakdown") or {}).get("optimizer_fraction")
    return advice(run["strategy"], int(run["world_size"]), share) if share is not None else None


GOOD_EFFICIENCY = 0.8
"""Of what the hardware allows: at or above it a configuration scaled well."""


def study_findings(study: dict) -> list[Finding]:
    """A scaling study's verdict: each configuration against what its hardware allows, worst first; figures
    that cannot be results (bench/validity.py) named with their reason, never as results."""
    out: list[Finding] = []
    runs = study.get("runs") or []
    base = next((r for r in runs if r.get("config") == study.get("baseline")), None)
    for r in runs:
        if r.get("status") != "ok":
            out.append(
                Finding(
                    "problem",
                    f"{r['label']} failed: runs/{r['name']}/failure.txt has the first failing rank and its traceback",
                )
            )
        elif r.get("rejected"):
            out.append(
                Finding(
                    "problem",
                    f"{r['label']}: no speedup shown: {r['rejected']['reason']}. Measure again on a quiet machine",
                )
            )
        elif r is not base and r.get("speedup") is not None:
            out.append(_scaling(r, base))
    for r in runs:
        if r.get("disturbed") and not r.get("rejected"):
            out.append(
                Finding("problem", f"{r['label']} was disturbed: {r['disturbed']} while it ran (its figures carry *)")
            )
    busy = busy_warning(study)
    if busy and not any(r.get("disturbed") for r in runs):
        out.append(Finding("problem", busy))
    out += [Finding("problem", text) for text in suggestions(study)]
    if study.get("shared_hardware"):
        out.append(Finding("note", study["shared_hardware"]))
    if plan_check(study):
        out.append(Finding("note", plan_check(study)))
    return sorted(out, key=lambda f: LEVELS.index(f.level))


def _scaling(run: dict, base: dict | None) -> Finding:
    star = "*" if run.get("speedup_disturbed") else ""
    against = f" over {base['label']}" if base else ""
    text = f"{run['label']}: {run['speedup']:.2f}x{star}{against}"
    eff = run.get("efficiency_vs_achievable")
    if eff is not None:
        text += (
            f", {eff:.0%}{star} of the {run['achievable_speedup']:.2f}x its hardware allows "
            f"({run['efficiency']:.0%}{star} parallel efficiency)"
        )
        level = "good" if eff >= GOOD_EFFICIENCY else "problem"
    else:
        text += f", {run['efficiency']:.0%}{star} parallel efficiency"
        level = "good" if run["efficiency"] >= GOOD_EFFICIENCY else "problem"
    if star:
        text += f" (* disturbed: {run['speedup_disturbed']})"
        level = "note" if level == "good" else level
    return Finding(level, text)


def sweep_findings(results: list, metric: str | None) -> list[Finding]:
    """A sweep's verdict: how many tasks finished, which failed, and the best configuration by ``metric``."""
    done = [r for r in results if r.state == "finished"]
    failed = [r for r in results if r.state.startswith("failed")]
    pending = [r for r in results if r.state == "pending"]
    out = [
        Finding("problem", f"task {r.index} ({_config(r)}) {r.state}: its log is in task-{r.index}/") for r in failed
    ]
    if pending:
        out.append(
            Finding(
                "note",
                f"{len(pending)} task(s) not finished (queued, running or never started): "
                f"{', '.join(str(r.index) for r in pending)}",
            )
        )
    have = [r for r in results if metric and metric in r.metrics]
    if have:
        best = have[0]
        out.append(
            Finding(
                "good", f"best by {metric}: task {best.index} ({_config(best)}), {metric} {best.metrics[metric]:.6g}"
            )
        )
    out.append(Finding("note" if failed or pending else "good", f"{len(done)} of {len(results)} task(s) finished"))
    return sorted(out, key=lambda f: LEVELS.index(f.level))


def _config(result) -> str:
    return " ".join(f"{k}={v}" for k, v in result.config.items())
