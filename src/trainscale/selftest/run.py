"""``trainscale selftest``: prove trainscale on this node's GPUs (or a SLURM job's), with figures.

Two launches of ``python -m trainscale.selftest.rank``, made exactly as training is launched
(``trainscale run``'s launcher locally; ``trainscale slurm``'s plan, lint and submission with
``--slurm``): the checks (selftest/checks.py), then the hang, which is expected to fail with
an error naming the rank that stopped. The outcome is a pass/fail table and two files to attach to
a support ticket, ``selftest.json`` and ``selftest.txt``, in the output directory.

Without GPUs the same checks run on CPU ranks over gloo: the GPU-only parts (one GPU per rank, NCCL,
CUDA events, GPU-local CPUs) say so instead.
"""

from __future__ import annotations

import datetime
import json
import os
import shlex
import socket
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainscale.bench.slurm_runs import prepare
from trainscale.bench.study import choose_out_dir
from trainscale.doctor.facts import read_versions
from trainscale.errors import ConfigError, did_you_mean
from trainscale.launch.trial import here, on_slurm
from trainscale.topology import PLAN_ENV

MODULE = "trainscale.selftest.rank"
CHECK_NAMES = ("devices", "all-reduce", "equivalence", "strategies", "resume", "breakdown", "binding", "hang")
HANG_MARGIN_S = 60.0
"""The promise: a hung rank is named within the collective timeout plus this."""


@dataclass(frozen=True, kw_only=True)
class SelftestSpec:
    """What to check, where."""

    nproc: int | None = None
    """Ranks per node; default one per visible GPU, or 2 CPU ranks without GPUs (SLURM: the profile's GPUs)."""
    device: str = "auto"
    """auto (GPUs when visible), cpu or cuda."""
    out_dir: Path | None = None
    """Where the report, logs and scratch files go (new or empty); default selftest-out/<timestamp>."""
    timeout_s: float = 120.0
    """Collective timeout of the checks."""
    hang_timeout_s: float = 10.0
    """Collective timeout of the hang check: the hung rank must be named within it + 60 s."""
    sizes: str = "auto"
    """All-reduce sweep (bench allreduce's --sizes; auto: up to 1GB on GPUs, 16MB on CPUs)."""
    skip: tuple[str, ...] = ()
    """Checks to leave out (e.g. deepspeed, whose first start compiles for a minute)."""
    deterministic: bool = True
    """Resume checked bitwise with deterministic mode (GPUs); False checks it within 1e-5 instead."""
    slurm: Any = None
    """A bench.slurm_runs.SlurmTarget: run both launches as batch jobs of that profile."""
    nodes: int = 1
    """Nodes of the SLURM jobs."""

    def __post_init__(self) -> None:
        for name in self.skip:
            if name not in (*CHECK_NAMES, "deepspeed"):
                raise ConfigError(
                    f"--skip {name!r} is not a selftest check", hint=did_you_mean(name, [*CHECK_NAMES, "deepspeed"])
                )
        if self.nproc is not None and self.nproc < 1:
            raise ConfigError(f"--nproc {self.nproc}: at least one rank is needed", hint="e.g. --nproc 2")
        if self.timeout_s <= 0 or self.hang_timeout_s <= 0:
            raise ConfigError("--timeout and --hang-timeout must be positive seconds", hint="e.g. --hang-timeout 10")
        if self.nodes < 1:
            raise ConfigError(f"--nodes {self.nodes} must be >= 1", hint="e.g. --nodes 2")
        if self.nodes > 1 and self.slurm is None:
            raise ConfigError(
                f"--nodes {self.nodes} needs --slurm",
                hint="add --slurm --profile NAME --time HH:MM:SS, or check this node alone",
            )
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"--device {self.device!r} unknown", hint="use auto, cpu or cuda")


@dataclass(kw_only=True)
class SelftestReport:
    """The outcome: one row per check, and what ran where."""

    command: str
    created: str
    host: str
    meta: dict[str, Any] = field(default_factory=dict)
    checks: list[dict[str, Any]] = field(default_factory=list)
    versions: dict[str, Any] = field(default_factory=dict)
    out_dir: str = ""

    def counts(self) -> dict[str, int]:
        return {s: sum(c["status"] == s for c in self.checks) for s in ("pass", "fail", "warn", "skip")}

    @property
    def ok(self) -> bool:
        return self.counts()["fail"] == 0 and bool(self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "counts": self.counts(), "ok": self.ok}


def _default_nproc(spec: SelftestSpec) -> int:
    if spec.nproc is not None:
        return spec.nproc
    if spec.slurm is not None:
        ranks = spec.slurm.nodes_ranks
        if not ranks:
            raise ConfigError(
                f"profile {spec.slurm.profile!r} has no GPUs per node to say how many ranks a node runs",
                hint="give --gpus-per-node R (ranks per node)",
            )
        return ranks
    import torch  # noqa: PLC0415 (torch-free module)

    gpus = torch.cuda.device_count() if spec.device != "cpu" and torch.cuda.is_available() else 0
    return gpus or 2


def out_directory(requested: Path | None, now: datetime.datetime | None = None) -> Path:
    """A new directory for this selftest: never one holding anything already."""
    return choose_out_dir(requested, Path("selftest-out"), now, kept="a report is never overwritten")


def rank_args(spec: SelftestSpec, phase: str, out: Path, workdir: Path) -> tuple[str, ...]:
    timeout = spec.hang_timeout_s if phase == "hang" else spec.timeout_s
    args = [
        phase,
        "--out",
        str(out.absolute()),
        "--workdir",
        str(workdir.absolute()),
        "--device",
        spec.device,
        "--timeout",
        f"{timeout:g}",
        "--sizes",
        spec.sizes,
    ]
    if spec.skip:
        args += ["--skip", ",".join(spec.skip)]
    if not spec.deterministic:
        args.append("--nondeterministic")
    return tuple(args)


def run_selftest(spec: SelftestSpec, command: str, say: Callable[[str], None] = lambda text: None) -> SelftestReport:
    """Run both launches (locally, or as SLURM jobs) and build the report; writes nothing but the run's files."""
    nproc = _default_nproc(spec)
    out_dir = out_directory(spec.out_dir)
    (out_dir / "work").mkdir(parents=True, exist_ok=True)
    checks_file, hang_file = out_dir / "checks.json", out_dir / "hang.json"
    report = SelftestReport(
        command=command,
        host=socket.gethostname(),
        out_dir=str(out_dir),
        created=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        versions={k: v for k, v in asdict(read_versions()).items() if k != "executable"},
    )
    hang = nproc * spec.nodes >= 2 and "hang" not in spec.skip
    phases = {"checks": checks_file, **({"hang": hang_file} if hang else {})}
    if spec.slurm is not None:
        outcomes = _run_slurm(spec, nproc, out_dir, phases, say, command)
    else:
        outcomes = _run_local(spec, nproc, out_dir, phases, say)
    ok, summary = outcomes["checks"]
    if checks_file.exists():
        data = json.loads(checks_file.read_text())
        report.meta, report.checks = data["meta"], data["checks"]
    else:
        report.checks = [
            {"name": "launch", "status": "fail", "figure": "the checks wrote no result", "detail": {"summary": summary}}
        ]
    if hang:
        report.checks.append(hang_row(hang_file, spec.hang_timeout_s, outcomes["hang"]))
    else:
        reason = "skipped (--skip)" if "hang" in spec.skip else "needs 2 or more ranks"
        report.checks.append({"name": "hang", "status": "skip", "figure": reason, "detail": {}})
    report.meta.setdefault("ranks_per_node", nproc)
    report.meta["nodes_requested"] = spec.nodes
    return report


def hang_record(out: Path, rank: int) -> Path:
    """Where ``rank`` records its finding of the hang phase: beside ``out`` (hang.json -> hang.rank3.json)."""
    return out.with_name(f"{out.stem}.rank{rank}{out.suffix}")


def hang_row(path: Path, timeout_s: float, outcome: tuple[bool, str]) -> dict[str, Any]:
    """The hang check's verdict: some rank's error named the hung rank, with its Python stack, within the
    timeout + HANG_MARGIN_S. Every waiting rank records its own finding (``hang.rankN.json``): the
    launcher ends the others as soon as one ends, so which of them gets to write is a race."""
    launched_ok, summary = outcome
    found = []
    for candidate in sorted(path.parent.glob(f"{path.stem}.rank*{path.suffix}")):
        try:
            found.append(json.loads(candidate.read_text()))
        except (OSError, json.JSONDecodeError):
            continue  # a rank ended while writing: another's record may still tell
    if not found:
        return {
            "name": "hang",
            "status": "fail",
            "detail": {"summary": summary},
            "figure": "no rank reported a named error" + (" (the launch ended cleanly)" if launched_ok else ""),
        }

    def named(seen: dict[str, Any]) -> bool:
        return f"rank(s) {seen['hung_rank']} did not arrive" in seen["message"]

    seen = min(found, key=lambda s: (not named(s), "stop_participating" not in s["message"], s["seconds"]))
    stack = "stop_participating" in seen["message"]
    within = seen["seconds"] <= timeout_s + HANG_MARGIN_S
    ok = named(seen) and stack and within and not launched_ok
    figure = (
        f"rank {seen['hung_rank']} named{' with its stack' if stack else ''} by rank {seen.get('rank', 0)} "
        f"{seen['seconds']:.1f} s after it stopped (timeout {timeout_s:g} s, limit {timeout_s + HANG_MARGIN_S:g} s, "
        f"{seen.get('backend')})"
    )
    if not named(seen):
        figure += "; no error names it"
    elif not stack:
        figure += "; without its stack"
    return {
        "name": "hang",
        "status": "pass" if ok else "fail",
        "figure": figure,
        "detail": {**seen, "records": len(found), "stack": stack, "summary": summary[-2000:]},
    }


def _run_local(spec: SelftestSpec, nproc: int, out_dir: Path, phases: dict, say) -> dict[str, tuple[bool, str]]:
    # Bound like `trainscale run` binds when asked, so the binding check checks trainscale's plan.
    env = {} if os.environ.get(PLAN_ENV) else {PLAN_ENV: "topology"}
    outcomes = {}
    for phase, out in phases.items():
        say(f"{phase}: {nproc} local rank(s)" + (" (expected to fail: one rank stops)" if phase == "hang" else ""))
        # the ranks' console output is kept from the table; every rank's log stays under logs/<phase>/
        done = here(
            MODULE,
            rank_args(spec, phase, out, out_dir / "work"),
            module=True,
            nproc=nproc,
            env=env,
            run_dir=out_dir / "logs" / phase,
        )
        outcomes[phase] = (done.ok, done.summary)
    return outcomes


def _run_slurm(
    spec: SelftestSpec, nproc: int, out_dir: Path, phases: dict, say, command: str
) -> dict[str, tuple[bool, str]]:
    target = spec.slurm
    jobs = {
        f"selftest-{phase}": target.job(
            name=f"selftest-{phase}",
            nodes=spec.nodes,
            ranks_per_node=nproc,
            module=MODULE,
            output_dir=(out_dir / "jobs" / phase).absolute(),
            args=rank_args(spec, phase, out, out_dir / "work"),
            command_line=tuple(shlex.split(command)),
        )
        for phase, out in phases.items()
    }
    prepared = prepare(target, jobs)  # every job linted before the first is submitted
    outcomes = {}
    for phase in phases:
        job = prepared[f"selftest-{phase}"]
        done = on_slurm(
            job.spec,
            target.cluster,
            job.plan,
            poll_s=target.poll_s,
            say=lambda text, phase=phase: say(f"{phase}: {text}"),
        )
        outcomes[phase] = (done.ok, done.summary)
    return outcomes


STATUS = {"pass": "PASS", "fail": "FAIL", "warn": "WARN", "skip": "skip"}


def render(report: SelftestReport) -> str:
    """The pass/fail table with its figures, then where the files are."""
    meta, versions = report.meta, report.versions
    where = (
        f"{meta.get('world_size', '?')} rank(s) on {meta.get('num_nodes', '?')} node(s), "
        f"{meta.get('device', '?')} ({meta.get('backend') or 'no process group'})"
    )
    lines = [
        f"trainscale selftest: {where}; host {report.host}, {report.created}",
        f"trainscale {versions.get('trainscale')}, torch {versions.get('torch')}"
        + "".join(
            f", {name} {versions[k]}"
            for k, name in (("cuda", "CUDA"), ("hip", "ROCm"), ("nccl", "NCCL"))
            if versions.get(k)
        ),
        "",
        f"{'check':<12} {'result':<6} figures",
    ]
    for check in report.checks:
        lines.append(f"{check['name']:<12} {STATUS.get(check['status'], check['status']):<6} {check['figure']}")
    counts = report.counts()
    lines += [
        "",
        f"Summary: {counts['pass']} passed, {counts['fail']} failed, {counts['warn']} warning(s), "
        f"{counts['skip']} skipped",
    ]
    for check in report.checks:
        if check["status"] == "fail" and check.get("detail", {}).get("summary"):
            lines += ["", f"{check['name']}: {check['detail']['summary'].strip()[-1500:]}"]
    return "\n".join(lines) + "\n"


def write_report(report: SelftestReport) -> tuple[Path, Path]:
    """``selftest.json`` (everything) and ``selftest.txt`` (the table) in the output directory."""
    out = Path(report.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, text_path = out / "selftest.json", out / "selftest.txt"
    json_path.write_text(json.dumps(report.to_dict(), indent=2, default=str) + "\n")
    text_path.write_text(render(report))
    return json_path, text_path
