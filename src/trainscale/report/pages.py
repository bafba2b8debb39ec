"""One page per thing `trainscale report` reads — a run, a study, a sweep (a SLURM job is its run or its
sweep) — each as a header (what ran, where, when, versions), a verdict, tables and plots."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from trainscale.bench import plots as study_plots
from trainscale.bench.results import markdown_table, plan_rows, sweep_table
from trainscale.bench.validity import assess, notes
from trainscale.report import plots
from trainscale.report.gather import Gathered, read_run
from trainscale.report.header import Facts, run_facts, study_facts, sweep_facts
from trainscale.report.sources import Source, records_dir, resolve
from trainscale.report.verdict import Finding, findings, study_findings, sweep_findings


@dataclass
class Table:
    head: list[str]
    rows: list[list[str]]
    notes: list[str] = field(default_factory=list)


@dataclass
class Section:
    title: str
    verdict: list[Finding] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    images: list[tuple[str, Path]] = field(default_factory=list)
    """(caption, PNG) in the order shown."""
    paragraphs: list[str] = field(default_factory=list)


@dataclass
class Page:
    kind: str
    title: str
    source: Path
    facts: Facts
    verdict: list[Finding]
    sections: list[Section]
    missing: list[str] = field(default_factory=list)
    """Optional parts left out (plots without matplotlib), each with how to get it."""


def build(
    target: str, out: Path | None, *, sacct_run: Callable[..., subprocess.CompletedProcess] = subprocess.run
) -> Page:
    """The page of ``target``; its plots are drawn into ``out`` (none when ``out`` is None: text only)."""
    source = resolve(target)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    page = {"run": run_page, "study": study_page, "sweep": sweep_page}[source.kind](source, out, sacct_run)
    if out is not None and plots.pyplot() is None and not any(section.images for section in page.sections):
        page.missing.append(plots.MISSING)
    return page


def rank_table(g: Gathered) -> Table:
    head = [
        "rank",
        "host",
        "steps",
        "step median (ms)",
        "p90 (ms)",
        "data",
        "forward",
        "backward",
        "optimizer",
        "comm",
        "samples/s",
        "tokens/s",
        "MFU",
        "peak memory",
    ]
    rows = []
    for r in g.ranks:
        step = sum(r.shares.values()) or 1.0  # the mean step: the parts' means add up to it (and to 100%)
        rows.append(
            [
                str(r.rank),
                r.host,
                str(r.steps),
                f"{r.step_median_s * 1e3:.1f}",
                f"{r.step_p90_s * 1e3:.1f}",
                *(f"{r.shares[k] / step:.0%}" for k in ("data", "compute", "backward", "optimizer", "comm")),
                f"{r.samples_per_s:.0f}" if r.samples_per_s else "-",
                f"{r.tokens_per_s:.0f}" if r.tokens_per_s else "-",
                f"{r.mfu:.1%}" if r.mfu is not None else "-",
                f"{r.peak_mem_bytes / 2**20:.0f} MiB" if r.peak_mem_bytes else "-",
            ]
        )
    return Table(
        head,
        rows,
        [
            "data: waiting for the next batch; forward: this rank's own computing; comm: "
            "the waits at the collectives (for a late rank too); "
            "shares of the mean step after the first "
            "(the start-up's: the time-shares plot), which a few slow steps make longer than the "
            "median"
        ],
    )


def _run_verdict(g: Gathered) -> list[Finding]:
    found = findings(g)
    run = g.extra.get("run") or {}
    failure = g.extra.get("failure")
    if failure:
        found.insert(0, Finding("problem", "the run failed: " + "; ".join(failure)))
    elif run.get("ok") is False:
        found.insert(
            0,
            Finding(
                "problem",
                "the run failed: the first failing rank's traceback is in its "
                f"attempt_<k>/<rank>/ logs under {g.source}",
            ),
        )
    if not g.ranks:
        found.append(
            Finding(
                "note",
                "no step records in metrics/: TRAINSCALE_RECORD=0, a script that ran no "
                "optimizer step (docs/observability.md), or a run that stopped before its "
                "first step",
            )
        )
    return found


def _run_section(title: str, where: Path) -> Section:
    """A study's configuration or a sweep's task: its verdict and ranks."""
    g = read_run(where)
    return Section(title, verdict=_run_verdict(g), tables=[rank_table(g)] if g.ranks else [])


def run_page(source: Source, out: Path | None, sacct_run) -> Page:
    g = read_run(source.path, job_id=source.job_id, sacct_run=sacct_run)
    sections = []
    if g.ranks:
        sections.append(
            Section("Ranks", tables=[rank_table(g)], images=plots.run_plots(g, out) if out is not None else [])
        )
    if g.accounting or source.job_id:
        acct = g.accounting or {}
        rows = [
            [k, str(acct.get(k, ""))]
            for k in ("State", "Elapsed", "AllocCPUS", "TotalCPU", "MaxRSS", "NNodes")
            if k in acct
        ]
        if acct.get("cpu_efficiency") is not None:
            rows.append(["CPU efficiency", f"{acct['cpu_efficiency']:.0%}"])
        sections.append(
            Section(
                "SLURM accounting",
                tables=[Table(["field", "value"], rows)] if rows else [],
                paragraphs=[] if rows else [g.accounting_note],
            )
        )
    files = [f"{p.name}/" if p.is_dir() else p.name for p in sorted(source.path.iterdir()) if p.name != "report"]
    sections.append(Section("Files", paragraphs=[f"{source.path}: {', '.join(files)}"]))
    return Page("run", f"Run {source.path.name}", source.path, run_facts(g), _run_verdict(g), sections)


STUDY_PLOTS = {
    "speedup": "Speedup against the ideal",
    "throughput": "Throughput per configuration",
    "breakdown": "Where a training step's time goes",
    "sweep": "Batch-size sweep",
}


def study_page(source: Source, out: Path | None, sacct_run) -> Page:
    study = json.loads((source.path / "results.json").read_text())
    marked = all("disturbed" in r for r in study.get("runs", []))
    if study.get("baseline"):  # the same marks for a study bench made before it marked figures
        assess(study["runs"], study["baseline"], cores=(study.get("environment") or {}).get("cores"))
    sweep = bool((study.get("spec") or {}).get("sweep_batches"))
    text = sweep_table(study) if sweep else markdown_table(study)
    lines = [[c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines()]
    table = Table(lines[0], lines[2:], notes(study))
    images: list[tuple[str, Path]] = []
    if out is not None:
        # the study's own PNGs; drawn here for a study that has none (bench without matplotlib, --no-plots)
        # or whose plots predate the marks
        own = {
            name: source.path / f"{name}.png"
            for name in STUDY_PLOTS
            if marked and (source.path / f"{name}.png").is_file()
        }
        if not own and study_plots.available():
            own = {name: Path(path) for name, path in study_plots.make_all(study, out).items()}
        images += [(caption, own[name]) for name, caption in STUDY_PLOTS.items() if name in own]
    sections = [Section("Scaling study", tables=[table], images=images)]
    planned = plan_rows(study)
    if planned and planned[0]:
        sections.append(Section("The plan against the measurements", tables=[Table(*planned[:2], [planned[2]])]))
    elif planned:
        sections.append(Section("The plan against the measurements", verdict=[Finding("note", planned[2])]))
    for run in study.get("runs", []):
        title, where = f"{run['label']} ({run['name']})", records_dir(source.path, run)
        sections.append(
            _run_section(title, where)
            if where
            else Section(
                title,
                verdict=[
                    Finding(
                        "note",
                        "no records of this configuration" + (": it failed" if run.get("status") != "ok" else ""),
                    )
                ],
            )
        )
    return Page(
        "study",
        f"Scaling study {source.path.name}",
        source.path,
        study_facts(study, source.path),
        study_findings(study),
        sections,
    )


def sweep_page(source: Source, out: Path | None, sacct_run) -> Page:
    from trainscale.launch.slurm import sweep  # noqa: PLC0415 (CLI start-up)

    results = sweep.gather(source.path)
    metric = sweep.choose_metric(results, None)
    ordered = sweep.ranked(results, metric)
    head, rows = sweep.table(ordered, metric)
    images = []
    if out is not None:
        own = source.path / "results.png"
        path = own if own.is_file() else sweep.plot(source.path, ordered, metric)  # as `sweep status` draws it
        if path is not None:
            images.append((f"{metric} per task, best first", path))
    sections = [
        Section(
            "Tasks",
            tables=[Table(head, rows, [f"best first by {metric}" if metric else "no task reported a known metric"])],
            images=images,
        )
    ]
    sections += [
        _run_section(
            f"task {r.index}: " + " ".join(f"{k}={v}" for k, v in r.config.items()), source.path / f"task-{r.index}"
        )
        for r in results
        if (source.path / f"task-{r.index}" / "metrics").is_dir()
    ]
    data = json.loads((source.path / "sweep.json").read_text())
    submission = source.path / "submission.json"
    facts = sweep_facts(
        data, json.loads(submission.read_text()) if submission.is_file() else None, source.path, len(results)
    )
    return Page("sweep", f"Sweep {source.path.name}", source.path, facts, sweep_findings(ordered, metric), sections)
