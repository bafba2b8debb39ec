"""The top of every page: what ran, on how many ranks and nodes, with which strategy, when, where, and
with which versions — from what each maker wrote (run.json, submission.json, results.json, sweep.json)
and, where those are silent, from the ranks' own records."""

from __future__ import annotations

import datetime
import shlex
from pathlib import Path
from typing import Any

from trainscale.bench.results import study_mode
from trainscale.report.gather import Gathered

Facts = list[tuple[str, str]]


def _when(value: Any) -> str:
    if isinstance(value, (int, float)):
        return datetime.datetime.fromtimestamp(value).astimezone().isoformat(timespec="seconds")
    return str(value) if value else "-"


def _versions(v: dict | None) -> str:
    v = v or {}
    parts = [f"{name} {v[name]}" for name in ("trainscale", "torch", "python") if v.get(name)]
    return ", ".join(parts) or "-"


def _command(cmd: Any) -> str:
    if isinstance(cmd, list):
        return shlex.join(str(c) for c in cmd)
    return str(cmd or "-")


def run_facts(g: Gathered) -> Facts:
    run, sub, meta = g.extra.get("run") or {}, g.submission or {}, g.extra.get("meta") or {}
    spec, plan = sub.get("spec") or {}, sub.get("plan") or {}
    if run.get("workload"):
        what = f"workload {run['workload']} " + shlex.join(run.get("args") or [])
    elif run.get("target"):
        what = f"{run.get('target_kind', 'script')} {run['target']} " + shlex.join(run.get("args") or [])
    elif spec:
        target = (
            spec.get("workload")
            and f"workload {spec['workload']}"
            or spec.get("module")
            and f"module {spec['module']}"
            or f"script {spec.get('script')}"
        )
        what = f"{target} " + shlex.join(str(a) for a in spec.get("args") or [])
    else:
        what = f"workload {meta['workload']}" if meta.get("workload") else "-"
    hosts = sorted({r.host for r in g.ranks})
    world = (
        meta.get("world_size")
        or plan.get("world_size")
        or (run.get("nproc_per_node") and run["nproc_per_node"] * _low(run.get("nnodes")))
    )
    nodes = plan.get("nodes") or len(hosts) or _low(run.get("nnodes"))
    ranks = f"{world or '?'} rank(s) on {nodes or '?'} node(s)"
    if plan.get("launcher"):
        ranks += f", {plan['launcher']} launch mode"
    if meta.get("device"):
        ranks += f", {meta['device']}" + (f" ({meta['backend']})" if meta.get("backend") else "")
    facts: Facts = [
        ("what ran", what.strip()),
        ("ranks", ranks),
        ("strategy", str(meta.get("strategy") or "not recorded (a script's own)")),
        ("date", _when(run.get("started_at") or sub.get("submitted_at") or meta.get("t"))),
        ("host", ", ".join(hosts) or run.get("host") or sub.get("host") or "-"),
        ("versions", _versions(run.get("versions") or sub.get("versions"))),
    ]
    if g.extra.get("job_id") or sub:
        facts.append(
            (
                "SLURM",
                f"job {g.extra.get('job_id') or '-'}, profile {sub.get('profile', '-')}, "
                f"submitted from {sub.get('host', '-')}",
            )
        )
    facts += [("command", _command(run.get("command") or sub.get("command"))), ("directory", str(g.source))]
    attempts = sorted(p.name for p in Path(g.source).glob("attempt_*"))
    if run.get("max_restarts") or len(attempts) > 1:
        facts.append(
            ("attempts", f"{len(attempts)} ({', '.join(attempts)}), --max-restarts {run.get('max_restarts', '?')}")
        )
    if run.get("ok") is not None:
        ended = (
            "FAILED"
            if not run["ok"]
            else "ended without training (no optimizer step)"
            if run.get("trained") is False
            else "finished"
        )
        facts.append(("outcome", f"{ended} after {run.get('seconds', 0):.1f}s"))
    return facts


def _low(nnodes: Any) -> int:
    try:
        return int(str(nnodes or "1").split(":")[0])
    except ValueError:
        return 1


def study_facts(study: dict, path: Path) -> Facts:
    env, spec = study.get("environment") or {}, study.get("spec") or {}
    runs = study.get("runs") or []

    mode = "batch-size sweep" if spec.get("sweep_batches") else study_mode(spec)
    configs = ", ".join(f"{r['label']} ({r['world_size']} rank(s), {r.get('nodes') or 1} node(s))" for r in runs)
    strategies = sorted({str(r["strategy"]) for r in runs if r.get("strategy")})
    where = "SLURM jobs, profile " + str((spec.get("slurm") or {}).get("profile")) if spec.get("slurm") else "this node"
    return [
        ("what ran", f"scaling study of {study.get('target', '-')}: {mode}, baseline {study.get('baseline', '-')}"),
        ("ranks", configs or "-"),
        ("strategy", ", ".join(strategies) or "-"),
        ("date", _when(study.get("started_at"))),
        ("host", f"{env.get('host', '-')} ({env.get('cores', '?')} cores, {env.get('device', '-')}); runs on {where}"),
        ("versions", _versions(env)),
        ("command", _command(study.get("command"))),
        ("directory", str(path)),
    ]


def sweep_facts(sweep: dict, submission: dict | None, path: Path, tasks: int) -> Facts:
    sub = submission or {}
    spec, plan = sub.get("spec") or {}, sub.get("plan") or {}
    grid = " ".join(f"{k}={','.join(v)}" for k, v in (sweep.get("grid") or {}).items())
    target = (
        spec.get("workload")
        and f"workload {spec['workload']}"
        or spec.get("script")
        and f"script {spec['script']}"
        or "-"
    )
    ranks = f"{plan['world_size']} rank(s) on {plan.get('nodes', '?')} node(s) per task" if plan else "-"
    return [
        ("what ran", f"sweep of {target} over {grid or '-'}: {tasks} task(s)"),
        ("ranks", ranks),
        ("strategy", str(spec.get("strategy") or "-")),
        ("date", _when(sub.get("submitted_at"))),
        ("host", f"submitted from {sub['host']}" if sub.get("host") else "-"),
        ("versions", _versions(sub.get("versions"))),
        ("SLURM", f"array job(s) {', '.join(sweep.get('jobs') or []) or '-'}, profile {sub.get('profile', '-')}"),
        ("command", _command(sub.get("command"))),
        ("directory", str(path)),
    ]
