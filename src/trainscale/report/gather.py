"""What a report is made of: one run's own records, what ran (run.json, submission.json) and SLURM's
accounting. Reading only (sacct is a subprocess, injectable)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainscale.errors import SlurmError
from trainscale.observe.reading import RankStats, rank_stats
from trainscale.observe.records import metrics_dir
from trainscale.observe.records import read_run as read_records
from trainscale.observe.stragglers import diagnose


@dataclass
class Gathered:
    source: Path
    ranks: list[RankStats]
    samples: dict[str, list[dict]]
    """Device samples per node."""
    events: list[dict]
    accounting: dict[str, Any] | None = None
    accounting_note: str = ""
    study: dict | None = None
    submission: dict | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _seconds(text: str) -> float:
    text = text.strip()
    if not text:
        return 0.0
    days, _, rest = text.rpartition("-")
    parts = [float(p) for p in rest.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0.0)
    return (int(days) if days else 0) * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def _bytes(text: str) -> int:
    text = text.strip()
    if not text:
        return 0
    unit = text[-1].upper()
    scale = {"K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}.get(unit)
    return int(float(text[:-1]) * scale) if scale else int(float(text))


def accounting(
    job_id: str, run: Callable[..., subprocess.CompletedProcess] = subprocess.run
) -> tuple[dict | None, str]:
    """The job's sacct line (launch/slurm/queue.py's one reader) as the page shows it, with the peak memory of its
    steps and its CPU efficiency."""
    from trainscale.launch.slurm.queue import sacct  # noqa: PLC0415 (CLI start-up)

    try:
        rows = sacct(job_id, run)
    except SlurmError as exc:
        return None, exc.message
    main = next((r for r in rows if "." not in r.job_id), None)
    if main is None:
        return None, "sacct returned no row for this job"
    elapsed, cpu = _seconds(main.elapsed), _seconds(main.total_cpu)
    return {
        "State": f"{main.state} {main.reason}".strip(),
        "Elapsed": main.elapsed,
        "AllocCPUS": main.alloc_cpus,
        "TotalCPU": main.total_cpu,
        "MaxRSS": main.max_rss,
        "NNodes": main.nodes,
        "MaxRSS_bytes": max(_bytes(r.max_rss) for r in rows),
        "cpu_efficiency": cpu / (elapsed * main.alloc_cpus) if elapsed and main.alloc_cpus else None,
    }, ""


def read_run(
    run_dir: Path, *, job_id: str | None = None, sacct_run: Callable[..., subprocess.CompletedProcess] = subprocess.run
) -> Gathered:
    """One run's records (``<run_dir>/metrics/``, none when it recorded nothing), what ran (``run.json`` of
    ``trainscale run``, ``submission.json`` of ``trainscale slurm``) and SLURM's accounting of ``job_id``."""
    info = _json(run_dir / "run.json") or {}
    # a node's logs whose records went to the run's home (a SLURM job's run directory): read them there
    where = Path(info["records"]) if not metrics_dir(run_dir).is_dir() and info.get("records") else run_dir
    recorded = read_records(where) if metrics_dir(where).is_dir() else {"ranks": {}, "nodes": {}, "events": []}
    ranks = [s for s in (rank_stats(r, recs) for r, recs in recorded["ranks"].items()) if s is not None]
    acct, note = accounting(job_id, sacct_run) if job_id else (None, "")
    meta = next((recs[0] for recs in recorded["ranks"].values() if recs and recs[0].get("kind") == "meta"), {})
    return Gathered(
        source=run_dir,
        ranks=ranks,
        samples=recorded["nodes"],
        events=recorded["events"],
        accounting=acct,
        accounting_note=note,
        submission=_json(run_dir / "submission.json"),
        extra={
            "run": info,
            "meta": meta,
            "job_id": job_id,
            "diagnosis": diagnose(recorded["ranks"]),
            "failure": info.get("failure") or _job_failure(job_id, acct),
        },
    )


def _job_failure(job_id: str | None, acct: dict | None) -> list[str] | None:
    """A failed SLURM job's first failing rank and how, from its files (launch/slurm/triage.py); its state from
    sacct, else from what the scheduler still says (a cluster without accounting)."""
    if not job_id:
        return None
    state = str((acct or {}).get("State", "")).split()[0] if acct else ""
    if not state:
        from trainscale.launch.slurm.queue import job_info  # noqa: PLC0415 (CLI start-up)

        try:
            info = job_info(job_id)
        except Exception:  # no scheduler reachable from here: the job's own files still tell
            info = None
        state = info.state if info is not None else ""
    if state in ("COMPLETED", "RUNNING", "PENDING", "COMPLETING", "CONFIGURING"):
        return None
    from trainscale.launch.slurm.jobdir import load_record  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.slurm.triage import find_failure, step_failure  # noqa: PLC0415 (CLI start-up)

    ended = f"job {job_id} ended {state}" if state else f"job {job_id}"
    try:
        record = load_record(job_id)
        output = record.batch_output.read_text(errors="replace") if record.batch_output.is_file() else ""
        found = step_failure(output) or find_failure(record.job_dir, record.launcher, output)
    except Exception:  # no record of it here, or its files are gone
        found = None
    if found is not None:  # and the root cause where the first failing rank's report names another (a hang)
        return [f"{ended}: {found.describe().splitlines()[0]}", *filter(None, [getattr(found, "cause", "")])]
    return [f"{ended}; its files do not say which rank failed"] if state else None


def _json(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None
