"""A study's numbers: one record per run, speedup and efficiency, and the files they are written to.

Speedup compares time per sample, so runs that processed slightly different sample counts (an epoch
not divisible by ranks x batch) are still compared fairly; when every run processed the same samples
it is exactly ``baseline runtime / runtime``. Efficiency = speedup / (ranks / baseline ranks).
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path

from trainscale.bench.validity import REJECTED, mark, notes
from trainscale.observe.reading import SECTIONS


def record_from_run(timing: dict | None, metrics: dict | None) -> dict:
    """A run's record: its timing from its step records (observe/reading.run_timing), its result (losses, accuracy,
    what the workload says of itself) from its metrics JSON where it wrote one."""
    metrics = metrics or {}
    last = (metrics.get("epochs") or [{}])[-1]
    return {
        **(timing or {}),
        "epochs": len(metrics.get("epochs") or []) or None,
        "train_loss": last.get("train_loss", metrics.get("train_loss")),
        "test_loss": last.get("test_loss"),
        "accuracy": last.get("accuracy"),
        "strategy": (metrics.get("options") or {}).get("strategy") or metrics.get("strategy"),
        "threads": metrics.get("threads"),
        "usable_cpus": metrics.get("usable_cpus"),
    }


def record_from_launch(seconds: float) -> dict:
    """A run that recorded no step (it failed, or recording was off): the whole launch is timed (start-up included)."""
    return {
        "timed": "launch",
        "runtime_s": seconds,
        "epochs": None,
        "steps": None,
        "samples": None,
        "samples_per_s": None,
        "step_time_s": None,
        "train_loss": None,
        "test_loss": None,
        "accuracy": None,
        "breakdown": None,
        "steady": None,
    }


def add_speedups(runs: list[dict], baseline_token: str) -> None:
    """Fill ``speedup`` and ``efficiency`` of every successful run, relative to the baseline run."""
    base = next((r for r in runs if r["config"] == baseline_token), None)
    for run in runs:
        run["speedup"] = run["efficiency"] = None
        if base is None or base.get("status") != "ok" or run.get("status") != "ok":
            continue
        run["speedup"] = speedup(base, run)
        run["efficiency"] = run["speedup"] / (run["world_size"] / base["world_size"])


def speedup(base: dict, run: dict) -> float:
    if base.get("samples") and run.get("samples"):
        return (base["runtime_s"] / base["samples"]) / (run["runtime_s"] / run["samples"])
    return base["runtime_s"] / run["runtime_s"]


def _fmt(value, pattern: str, missing: str = "-") -> str:
    return missing if value is None else pattern.format(value)


def _speed(run: dict, key: str, pattern: str) -> str:
    """A speedup or efficiency as a table shows it: "—(disturbed)" where it is above what the hardware allows,
    "*" where the run or its baseline was disturbed (bench/validity.py)."""
    if (run.get("rejected") or {}).get(key) is not None:
        return REJECTED
    value = run.get(key)
    return "-" if value is None else pattern.format(value) + mark(run, key)


def markdown_table(study: dict) -> str:
    """Seed 004's table: Version | Workers | Runtime (s) | Speedup | Parallel efficiency (+ a few more)."""
    head = [
        "Version",
        "Workers",
        "Runtime (s)",
        "Speedup",
        "Parallel efficiency",
        "Achievable",
        "Share of achievable",
        "Samples/s",
        "Comm. exposed",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in study["runs"]:
        if r.get("status") != "ok":
            lines.append(f"| {r['label']} | {r['world_size']} | failed | - | - | - | - | - | - |")
            continue
        breakdown = r.get("breakdown") or {}
        own = mark(r, "runtime_s")  # a disturbed run's own figures carry "*"; a rejected speedup is not shown
        row = [
            r["label"],
            str(r["world_size"]),
            f"{r['runtime_s']:.1f}{own}",
            _speed(r, "speedup", "{:.2f}x"),
            _speed(r, "efficiency", "{:.0%}"),
            _fmt(r.get("achievable_speedup"), "{:.2f}x"),
            _speed(r, "efficiency_vs_achievable", "{:.0%}"),
            _fmt(r.get("samples_per_s"), "{:.0f}") + own,
            _fmt(breakdown.get("communication_fraction"), "{:.0%}"),
        ]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def sweep_table(study: dict) -> str:
    head = ["Version", "Workers", "Batch per rank", "Global batch", "Time per epoch (s)", "Samples/s", "Accuracy"]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in study["runs"]:
        if r.get("status") != "ok":
            lines.append(
                f"| {r['label']} | {r['world_size']} | {r['per_rank_batch']} | {r['global_batch']} | failed | - | - |"
            )
            continue
        per_epoch = r["runtime_s"] / r["epochs"] if r.get("epochs") else None
        lines.append(
            f"| {r['label']} | {r['world_size']} | {r['per_rank_batch']} | {r['global_batch']} | "
            f"{_fmt(per_epoch, '{:.2f}')}{mark(r, 'runtime_s')} | "
            f"{_fmt(r.get('samples_per_s'), '{:.0f}')}{mark(r, 'runtime_s')} | "
            f"{_fmt(r.get('accuracy'), '{:.1%}')} |"
        )
    return "\n".join(lines)


CSV_FIELDS = (
    "config",
    "label",
    "status",
    "world_size",
    "nodes",
    "nproc_per_node",
    "per_rank_batch",
    "global_batch",
    "epochs",
    "steps",
    "samples",
    "runtime_s",
    "samples_per_s",
    "step_time_s",
    "speedup",
    "efficiency",
    "achievable_speedup",
    "efficiency_vs_achievable",
    "hardware",
    "train_loss",
    "test_loss",
    "accuracy",
    "data_s",
    "compute_s",
    "communication_s",
    "optimizer_s",
    "other_s",
    "communication_fraction",
    "strategy",
    "launch_s",
    "timed",
    "disturbed",
    "speedup_disturbed",
    "rejected_speedup",
    "rejected_reason",
)


def csv_text(study: dict) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=CSV_FIELDS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    for r in study["runs"]:
        row = dict(r)
        breakdown = r.get("breakdown") or {}
        for key in SECTIONS:
            row[f"{key}_s"] = breakdown.get(key)
        row["communication_fraction"] = breakdown.get("communication_fraction")
        rejected = r.get("rejected") or {}
        row["rejected_speedup"], row["rejected_reason"] = rejected.get("speedup"), rejected.get("reason")
        writer.writerow(row)
    return buf.getvalue()


def study_mode(spec: dict) -> str:
    """What a study held fixed, in the words HPC users read: every size trains the same data (a fixed problem:
    strong scaling of the run), with the per-rank batch fixed (the global batch grows: each step's work per
    rank stays, the ML sense of weak scaling) or the global batch fixed (each rank's share shrinks)."""
    batch = spec.get("batch_size", "?")
    if spec.get("max_steps"):
        work = f"{spec['max_steps']} step(s) of the baseline's batch (the same samples at each size)"
    else:
        work = f"{spec.get('epochs', '?')} epoch(s) at each size"
    if spec.get("scaling") == "strong":
        return f"a fixed problem: {work}, global batch {batch} split over the ranks"
    return f"a fixed problem: {work}, per-rank batch {batch} (the global batch grows with the ranks)"


def markdown_document(study: dict, plots: dict[str, str]) -> str:
    env = study["environment"]
    spec = study["spec"]
    mode = "batch-size sweep" if spec.get("sweep_batches") else study_mode(spec)
    parts = [
        f"# Scaling study: {study['target']}",
        "",
        f"{mode}; baseline {study['baseline']}; {env['device']}, {env['cores']} cores on {env['host']}; "
        f"torch {env['torch']}, trainscale {env['trainscale']}.",
        "",
        sweep_table(study) if spec.get("sweep_batches") else markdown_table(study),
        "",
    ]
    parts += [f"{line}\n" for line in notes(study)]
    planned = plan_table(study)
    if planned:
        parts += ["## The plan against the measurements", "", planned, ""]
    for label, text in caveats(study):
        parts += [f"**{label}:** {text}" if label else text, ""]
    parts += [f"![{name}]({Path(path).name})" for name, path in plots.items()]
    return "\n".join(parts) + "\n"


def plan_rows(study: dict) -> tuple[list[str], list[list[str]], str] | None:
    """The study's plan (made before its runs, plan/calibrate.py) against each configuration: header, rows and
    a sentence under them; None for a study without a plan."""
    plan = study.get("plan") or {}
    if not plan:
        return None
    if plan.get("error"):
        return [], [], f"No plan for this study: {plan['error']}."

    def size(value) -> str:
        return "-" if value is None else f"{value / 2**20:.1f} MiB"

    def error(value) -> str:
        return "-" if value is None else f"{value:+.0%}"

    head = [
        "configuration",
        "strategy modelled",
        "step ms planned",
        "measured",
        "error",
        "model state planned",
        "measured",
        "error",
        "peak planned",
        "measured",
        "error",
    ]
    rows = [
        [
            r["config"] + (" *" if r.get("disturbed") else ""),
            r.get("modelled") or r["strategy"],
            "too uncertain" if r.get("uncertain") else f"{r['predicted_step_s'] * 1e3:.1f}",
            _fmt(r["measured_step_s"] * 1e3, "{:.1f}") if r["measured_step_s"] == r["measured_step_s"] else "-",
            "-" if r.get("uncertain") else error(r["step_error"]),
            size(r["predicted_held"]),
            size(r["measured_held"]),
            error(r["held_error"]),
            size(r.get("predicted_peak")),
            size(r.get("measured_peak")),
            error(r.get("peak_error")),
        ]
        for r in plan.get("against") or []
    ]
    cal = plan.get("calibration") or {}
    note = (
        f"Planned before the runs from one rank's {cal.get('steps', '?')}-step calibration here "
        f"({plan.get('times_from', '?')}, batch {cal.get('batch', '?')}, {cal.get('threads', '?')} thread(s)) over "
        f"{plan.get('network_source', '?')}, as `trainscale plan` plans; measured: the median step after the "
        "warm-up, the fullest rank's memory table, the largest peak over the training steps; model state: memory "
        "for parameters, gradients and optimizer state; error = measured / planned - 1 (+: more than planned)"
        + (
            "; * disturbed: other work shared its cores"
            if any(r.get("disturbed") for r in plan.get("against") or [])
            else ""
        )
        + "".join(
            f"; too uncertain, {r['config']}: {r['uncertain']}" for r in plan.get("against") or [] if r.get("uncertain")
        )
    )
    return head, rows, note


def plan_check(study: dict) -> str | None:
    """One sentence: where the study's plan was furthest from its measurements (undisturbed configurations), each
    signed (+: the run took longer or held more than planned), with its configuration and both figures."""
    every = (study.get("plan") or {}).get("against") or []
    rows = [r for r in every if not r.get("disturbed")]
    if not every:
        return None
    which = ""
    if not rows:  # other work disturbed every run: their errors, said so
        rows, which = every, " (every configuration disturbed by other work on its cores)"

    def ms(value: float) -> str:
        return f"{value * 1e3:.1f} ms"

    def mib(value: float) -> str:
        return f"{value / 2**20:.1f} MiB"

    parts = []
    for what, error, planned, measured, show in (
        ("step time", "step_error", "predicted_step_s", "measured_step_s", ms),
        ("memory for parameters, gradients and optimizer state", "held_error", "predicted_held", "measured_held", mib),
        ("peak memory", "peak_error", "predicted_peak", "measured_peak", mib),
    ):
        # a step the plan said it could not predict (ranks sharing cores: plan/model.py) has no error
        found = [r for r in rows if r.get(error) is not None and not (error == "step_error" and r.get("uncertain"))]
        if found:
            r = max(found, key=lambda r: abs(r[error]))
            parts.append(
                f"{what} {r[error]:+.0%} on {r['config']} (planned {show(r[planned])}, measured {show(r[measured])})"
            )
    if not parts:
        return f"Plan vs measured{which}: nothing measured to compare"
    return (
        f"Plan vs measured, furthest off{which}: " + "; ".join(parts) + " (+: more than planned; every "
        'configuration in "The plan against the measurements")'
    )


def plan_table(study: dict) -> str | None:
    found = plan_rows(study)
    if found is None:
        return None
    head, rows, note = found
    if not head:
        return note
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n\n" + note + "."


def caveats(study: dict) -> list[tuple[str, str]]:
    """(label, sentence) of what goes under a study's table after its marks' notes: shared hardware, the
    plan's check (no label), a busy machine, suggestions."""
    no_plan = (study.get("plan") or {}).get("error")
    found = [
        ("Shared hardware", study.get("shared_hardware")),
        ("", plan_check(study) or (f"No plan for this study: {no_plan}" if no_plan else None)),
        ("Warning", busy_warning(study)),
        *(("Suggestion", text) for text in suggestions(study)),
    ]
    return [(label, text) for label, text in found if text]


def suggestions(study: dict) -> list[str]:
    """What to try next, per run, from its breakdown (a strategy's advice, e.g. ZeRO-1 when every DDP rank
    spends a large share of the step on the whole optimizer step)."""
    from trainscale.strategies import advice  # noqa: PLC0415 (torch-free module)

    out = []
    for r in study["runs"]:
        share = (r.get("breakdown") or {}).get("optimizer_fraction")
        if r.get("status") != "ok" or share is None or not r.get("strategy"):
            continue
        text = advice(r["strategy"], int(r["world_size"]), share)
        if text:
            out.append(f"{r['label']}: {text}")
    return out


def busy_warning(study: dict) -> str | None:
    """A note when the machine was already loaded (load average above its cores) as a run started."""
    cores = study["environment"].get("cores") or 1
    loads = [(r["name"], r["load_before"]) for r in study["runs"] if r.get("load_before") is not None]
    busy = [(n, x) for n, x in loads if x > cores]
    if not busy:
        return None
    worst = max(busy, key=lambda t: t[1])
    return (
        f"the machine was busy (1-minute load average up to {worst[1]:.1f} on {cores} cores, run {worst[0]}); "
        f"other processes competed with these runs, so their timings are unreliable"
    )


def write_all(out_dir: Path, study: dict, plots: dict[str, str]) -> dict[str, Path]:
    """results.json, results.csv and results.md (each replaced whole: a reader never sees half a file)."""
    paths = {"json": out_dir / "results.json", "csv": out_dir / "results.csv", "md": out_dir / "results.md"}
    texts = {
        "json": json.dumps({**study, "plots": plots}, indent=2, default=str) + "\n",
        "csv": csv_text(study),
        "md": markdown_document(study, plots),
    }
    for key, path in paths.items():
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(texts[key])
        os.replace(tmp, path)
    return paths
