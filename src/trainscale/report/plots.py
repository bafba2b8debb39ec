"""The report's own PNGs (matplotlib, Agg): a run's step time and time shares per rank, and utilisation over
time. None of them without matplotlib: the page then has its tables and says how to get the plots."""

from __future__ import annotations

import statistics
from pathlib import Path

from trainscale.bench.plots import pyplot, save
from trainscale.report.gather import Gathered

SHARE_LABELS = {
    "data": "data",
    "compute": "forward",
    "backward": "backward",
    "optimizer": "optimizer",
    "comm": "comm (exposed)",
    "other": "other",
}
"""The per-rank table's column names: the legend says what the table says."""
COLOURS = {
    "data": "#8da0cb",
    "compute": "#66c2a5",
    "backward": "#a6d854",
    "optimizer": "#e78ac3",
    "comm": "#fc8d62",
    "other": "#b3b3b3",
}
MISSING = "plots need matplotlib, which is not installed: pip install matplotlib"
WIDE = (10, 4)
"""Inches at 100 dpi: the page's width, so a plot is as wide as the tables above it."""


MANY = 32
"""Above this many ranks (or utilisation series) a plot gets a numeric rank axis and the series their median
and range: 1,024 labelled bars and a 1,024-entry legend took over a minute to draw (benchmarks/rank_costs.py)."""


def _label(ax, xlabel: str, ylabel: str, title: str, **legend) -> None:
    """Axis labels, title, and the legend beside the axes, never over the data."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, **legend)


def run_plots(g: Gathered, out: Path, prefix: str = "") -> list[tuple[str, Path]]:
    """(caption, PNG) of one run: step time and time shares per rank, utilisation over time."""
    plt = pyplot()
    if plt is None or not g.ranks:
        return []
    made = []
    many = len(g.ranks) > MANY  # one line over a numeric rank axis, not a labelled bar per rank
    names = [r.rank if many else str(r.rank) for r in g.ranks]
    medians, p90s = [r.step_median_s * 1e3 for r in g.ranks], [r.step_p90_s * 1e3 for r in g.ranks]
    fig, ax = plt.subplots(figsize=WIDE)
    if many:
        ax.plot(names, medians, color="#1b9e77", lw=0.8, label="median")
        ax.plot(names, p90s, ".", color="#d95f02", ms=2, label="p90")
    else:
        ax.bar(names, medians, color="#1b9e77", label="median")
        ax.scatter(names, p90s, color="#d95f02", zorder=3, label="p90")
    _label(ax, "rank", "step time (ms)", "Step time per rank")
    made.append(("Step time per rank", save(fig, out / f"{prefix}step-time.png")))

    fig, ax = plt.subplots(figsize=WIDE)
    bottom = [0.0] * len(names)
    for key, colour in COLOURS.items():
        values = [r.shares[key] * 1e3 for r in g.ranks]
        if not many:
            ax.bar(names, values, bottom=bottom, color=colour, label=SHARE_LABELS[key])
        bottom = [b + v for b, v in zip(bottom, values)]
    if many:
        ax.stackplot(
            names,
            *[[r.shares[key] * 1e3 for r in g.ranks] for key in COLOURS],
            colors=list(COLOURS.values()),
            labels=[SHARE_LABELS[key] for key in COLOURS],
        )
    ax.set_ylim(0, max(bottom) * 1.08)  # the stack's top (other) inside the axes
    handles, labels = ax.get_legend_handles_labels()  # top to bottom as the bars stack
    _label(ax, "rank", "ms per step", "Where each rank's step goes", handles=handles[::-1], labels=labels[::-1])
    made.append(("Time shares per rank", save(fig, out / f"{prefix}time-shares.png")))

    series = utilisation(g)
    if series:
        fig, ax = plt.subplots(figsize=WIDE)
        for label, (ts, values) in series.items():  # markers: a short run may have one sample
            ax.plot(ts, values, marker="o", ms=3, label=label)
        ax.set_xlim(left=0, right=max(1.0, max(max(t) for t, _ in series.values()) * 1.02))
        ax.set_ylim(0, max(100, max(max(v) for _, v in series.values()) * 1.05))
        _label(ax, "seconds since the first sample", "utilisation (%)", "Utilisation over time", fontsize=8)
        made.append(("Utilisation over time", save(fig, out / f"{prefix}utilisation.png")))
    return made


def utilisation(g: Gathered) -> dict[str, tuple[list[float], list[float]]]:
    series: dict[str, tuple[list[float], list[float]]] = {}
    starts = [s["t"] for samples in g.samples.values() for s in samples]
    if not starts:
        return series
    t0 = min(starts)
    if sum(len(s[0].get("gpus", [])) + len(s[0].get("procs", [])) for s in g.samples.values() if s) > MANY:
        return _spread(g, t0)
    for host, samples in g.samples.items():
        for s in samples:
            for gpu in s.get("gpus", []):
                ts, vs = series.setdefault(f"{host} GPU {gpu['index']}", ([], []))
                ts.append(s["t"] - t0)
                vs.append(float(gpu.get("util_pct") or 0.0))
            for i, proc in enumerate(s.get("procs", [])):
                ts, vs = series.setdefault(f"{host} rank process {i} CPU", ([], []))
                ts.append(s["t"] - t0)
                vs.append(float(proc.get("cpu_pct") or 0.0))
    return series


def _spread(g: Gathered, t0: float, bins: int = 200) -> dict[str, tuple[list[float], list[float]]]:
    """Many series (a node's every GPU and rank process, on every node) as their median, lowest and highest
    in ``bins`` time slices, GPUs and CPUs apart."""
    end = max(s["t"] for samples in g.samples.values() for s in samples) - t0 or 1.0
    slices: dict[str, dict[int, list[float]]] = {"GPU": {}, "CPU": {}}
    for samples in g.samples.values():
        for s in samples:
            i = min(bins - 1, int((s["t"] - t0) / end * bins))
            slices["GPU"].setdefault(i, []).extend(float(x.get("util_pct") or 0.0) for x in s.get("gpus", []))
            slices["CPU"].setdefault(i, []).extend(float(p.get("cpu_pct") or 0.0) for p in s.get("procs", []))
    out: dict[str, tuple[list[float], list[float]]] = {}
    for kind, by_slice in slices.items():
        full = sorted(i for i, values in by_slice.items() if values)
        if not full:
            continue
        ts = [(i + 0.5) * end / bins for i in full]
        label = "GPUs" if kind == "GPU" else "rank processes' CPU"
        for name, pick in (("median", statistics.median), ("lowest", min), ("highest", max)):
            out[f"{label}, {name}"] = (ts, [pick(by_slice[i]) for i in full])
    return out
