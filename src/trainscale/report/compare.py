"""``trainscale report RUN --against BASE``: two runs side by side — each step phase, throughput, peak memory and
MFU with its signed change — and what differs between them (versions, ranks, strategy, binding, environment, the
script's contents), so a slower run says what changed before anyone guesses. Reading only (report/gather.py).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from trainscale.errors import ConfigError
from trainscale.report.gather import Gathered, read_run
from trainscale.report.sources import resolve

PHASES = (
    ("data", "data wait"),
    ("compute", "forward"),
    ("backward", "backward"),
    ("optimizer", "optimizer"),
    ("comm", "communication (exposed)"),
    ("other", "other"),
)
REGRESSED = 3
"""The exit status of ``--max-regression PCT`` when the step time grew by more than PCT (1: a failure, 2: a usage
error)."""


@dataclass
class Comparison:
    base: str
    run: str
    rows: list[tuple[str, float | None, float | None, str]]
    """(figure, base, run, unit): ms, samples/s, MiB or % ."""
    differs: list[tuple[str, str, str]]
    """(what, base's, run's) for each fact that is not the same."""

    def change(self, figure: str) -> float | None:
        """run / base - 1 of ``figure`` (None where either is missing)."""
        base, run = next(((b, r) for name, b, r, _ in self.rows if name == figure), (None, None))
        return run / base - 1 if base and run is not None else None


def figures(g: Gathered) -> dict[str, float | None]:
    """One run's figures: the ranks' median step and its phases (their mean over the ranks), the job's samples per
    second, the largest peak and the mean MFU."""
    if not g.ranks:
        raise ConfigError(
            f"{g.source} has no step records to compare",
            hint="compare two runs that recorded steps (trainscale run records them)",
        )

    def mean(values: list) -> float | None:
        values = [v for v in values if v is not None]
        return statistics.fmean(values) if values else None

    out: dict[str, float | None] = {"step time": statistics.median(r.step_median_s for r in g.ranks)}
    out |= {name: mean([r.shares.get(key) for r in g.ranks]) for key, name in PHASES}
    rates = [r.samples_per_s for r in g.ranks if r.samples_per_s]
    out["throughput"] = sum(rates) if rates else None
    peaks = [r.peak_mem_bytes for r in g.ranks if r.peak_mem_bytes]
    out["peak memory"] = max(peaks) if peaks else None
    out["MFU"] = mean([r.mfu for r in g.ranks])
    return out


def facts(g: Gathered) -> dict[str, str]:
    """What ran, as run.json and rank 0's meta record say it."""
    run, meta = g.extra.get("run") or {}, g.extra.get("meta") or {}
    versions = run.get("versions") or {}
    out = {
        "trainscale": versions.get("trainscale"),
        "torch": versions.get("torch"),
        "python": versions.get("python"),
        "ranks": meta.get("world_size") or len(g.ranks),
        "strategy": meta.get("strategy"),
        "device": meta.get("device"),
        "threads per rank": meta.get("threads"),
        "rank 0's CPUs": ",".join(map(str, meta.get("cpus") or ())) or None,
        "what ran": run.get("workload") or run.get("target"),
        "arguments": " ".join(run.get("args") or ()) or None,
        "script sha256": (run.get("script_sha256") or "")[:12] or None,
        "host": run.get("host"),
    }
    out |= {f"${k}": v for k, v in (run.get("environment") or {}).items()}
    return {k: str(v) for k, v in out.items() if v is not None}


def compare(run_target: str, base_target: str) -> Comparison:
    sides = []
    for target in (base_target, run_target):
        source = resolve(target)
        if source.kind != "run":
            raise ConfigError(
                f"{target} is a {source.kind}, and --against compares two runs",
                hint="give two run directories (what `trainscale run` names at its end)",
            )
        sides.append(read_run(source.path, job_id=source.job_id))
    base, run = sides
    ours, theirs = figures(base), figures(run)
    units = {"throughput": "samples/s", "peak memory": "MiB", "MFU": "%"}
    rows = [(name, ours[name], theirs[name], units.get(name, "ms")) for name in ours]
    known, now = facts(base), facts(run)
    differs = [
        (k, known.get(k, "-"), now.get(k, "-"))
        for k in dict.fromkeys([*known, *now])
        if known.get(k) != now.get(k) and k != "host"
    ]
    return Comparison(str(base.source), str(run.source), rows, differs)


def render(c: Comparison, max_regression: float | None = None) -> list[str]:
    def show(value: float | None, unit: str) -> str:
        if value is None:
            return "-"
        return {
            "ms": f"{value * 1e3:.2f} ms",
            "MiB": f"{value / 2**20:.1f} MiB",
            "%": f"{value:.1%}",
            "samples/s": f"{value:.1f} samples/s",
        }[unit]

    table = [("", "base", "this run", "change")] + [
        (name, show(b, unit), show(r, unit), "-" if b is None or r is None or not b else f"{r / b - 1:+.1%}")
        for name, b, r, unit in c.rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(4)]
    lines = [f"{c.run} against {c.base} (change: this run / base - 1; + is more time, more samples, more memory)"]
    lines += ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in table]
    lines.append("")
    if c.differs:
        lines.append("What differs:")
        lines += [f"  {what}: {b} -> {r}" for what, b, r in c.differs]
    else:
        lines.append("What differs: nothing recorded (versions, ranks, strategy, binding, environment, script)")
    if max_regression is not None:
        change = c.change("step time")
        verdict = "REGRESSED beyond" if regressed(c, max_regression) else "within"
        lines.append(
            f"Step time {'-' if change is None else f'{change:+.1%}'}: {verdict} --max-regression {max_regression:g}%"
        )
    return lines


def regressed(c: Comparison, max_regression: float) -> bool:
    """The step time grew by more than ``max_regression`` percent."""
    change = c.change("step time")
    return change is not None and change * 100 > max_regression
