"""The study's PNGs (matplotlib, Agg): speedup vs ideal, throughput, time breakdown, batch sweep."""

from __future__ import annotations

import importlib.util
from pathlib import Path

COLOURS = {
    "data": "#8da0cb",
    "compute": "#66c2a5",
    "communication": "#fc8d62",
    "optimizer": "#e78ac3",
    "other": "#b3b3b3",
}
MISSING = "plots need matplotlib, which is not installed"


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def pyplot():
    """matplotlib's pyplot on the Agg backend; None without matplotlib."""
    try:
        import matplotlib  # noqa: PLC0415 (optional dependency)
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 (optional dependency)

    return plt


def _ok(study: dict) -> list[dict]:
    return [r for r in study["runs"] if r.get("status") == "ok"]


def speedup_plot(study: dict, path: Path) -> Path:
    plt = pyplot()
    runs = [r for r in _ok(study) if r.get("speedup") is not None]
    rejected = [r for r in _ok(study) if r.get("rejected")]
    base = next(r for r in study["runs"] if r["config"] == study["baseline"])
    fig, ax = plt.subplots(figsize=(10, 5))
    xs = sorted({r["world_size"] for r in runs + rejected} | {base["world_size"]})
    ax.plot(xs, [x / base["world_size"] for x in xs], "k--", lw=1, label="ideal (linear)")
    reach = sorted(
        (r["world_size"], r["achievable_speedup"]) for r in runs + rejected if r.get("achievable_speedup") is not None
    )
    if reach and any(abs(s - w / base["world_size"]) > 1e-9 for w, s in reach):
        ax.plot(
            [w for w, _ in reach],
            [s for _, s in reach],
            ":",
            color="#7570b3",
            lw=2,
            marker="^",
            label="achievable (this hardware)",
        )
    clean = [r for r in runs if not r.get("speedup_disturbed")]
    disturbed = [r for r in runs if r.get("speedup_disturbed")]
    ax.plot(
        [r["world_size"] for r in clean], [r["speedup"] for r in clean], "o", ms=8, color="#1b9e77", label="measured"
    )
    if disturbed:  # hollow: other work shared the CPUs of the run or of its baseline
        ax.plot(
            [r["world_size"] for r in disturbed],
            [r["speedup"] for r in disturbed],
            "o",
            ms=9,
            mfc="none",
            mew=2,
            color="#d95f02",
            label="measured, disturbed* (other work on its CPUs)",
        )
    for r in runs:
        ax.annotate(
            r["label"] + ("*" if r.get("speedup_disturbed") else ""),
            (r["world_size"], r["speedup"]),
            textcoords="offset points",
            xytext=(6, -12),
            fontsize=8,
        )
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("ranks (workers)")
    ax.set_ylabel(f"speedup over {base['label']}")
    ax.set_title(f"Speedup: {study['target']} ({study['spec']['scaling']} scaling)")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper left", fontsize=9)
    if rejected:  # never drawn as a result: named under the axes with the reason
        text = "\n".join(f"not shown: {r['label']}, {r['rejected']['reason']}" for r in rejected)
        fig.text(0.01, -0.02, text, fontsize=8, color="#b00", ha="left", va="top", wrap=True)
    return save(fig, path)


def _tick(run: dict) -> str:
    """A run's bar label: its label shortened, its batch in a sweep, "*" when disturbed."""
    batch = f"\nbatch {run['per_rank_batch']}" if run.get("sweep") else ""
    return run["label"].replace("DDP ", "").replace(" x ", "x") + batch + ("*" if run.get("disturbed") else "")


def throughput_plot(study: dict, path: Path) -> Path:
    plt = pyplot()
    runs = [r for r in _ok(study) if r.get("samples_per_s")]
    fig, ax = plt.subplots(figsize=(10, 4.5))
    bars = ax.bar(
        [_tick(r) for r in runs],
        [r["samples_per_s"] for r in runs],
        color=["#fdae6b" if r.get("disturbed") else "#66c2a5" for r in runs],
        hatch=None,
        edgecolor="#555",
    )
    for bar, r in zip(bars, runs):
        if r.get("disturbed"):
            bar.set_hatch("//")
        ax.annotate(
            f"{r['samples_per_s']:.0f}" + ("*" if r.get("disturbed") else ""),
            (bar.get_x() + bar.get_width() / 2, bar.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )
    ax.set_ylabel("training samples / s")
    ax.set_title(f"Throughput per configuration: {study['target']}")
    ax.grid(True, axis="y", alpha=0.3)
    ax.margins(y=0.15)
    if any(r.get("disturbed") for r in runs):
        fig.text(
            0.01,
            -0.02,
            "* hatched: disturbed, other work kept its CPUs busy while it ran",
            fontsize=8,
            color="#b00",
            ha="left",
            va="top",
        )
    return save(fig, path)


LABELS = {
    "data": "data wait",
    "compute": "compute (forward + backward)",
    "communication": "communication (exposed)",
    "optimizer": "optimizer step",
    "other": "other",
}


def breakdown_plot(study: dict, path: Path) -> Path | None:
    plt = pyplot()
    runs = [r for r in _ok(study) if r.get("breakdown")]
    if not runs:
        return None
    labels = [_tick(r) for r in runs]
    fig, ax = plt.subplots(figsize=(10, 4.8))
    bottom = [0.0] * len(runs)
    for key, colour in COLOURS.items():
        values = [r["breakdown"][key] * 1e3 for r in runs]
        ax.bar(labels, values, bottom=bottom, color=colour, label=LABELS[key])
        bottom = [b + v for b, v in zip(bottom, values)]
    for i, r in enumerate(runs):
        ax.annotate(
            f"comm {r['breakdown']['communication_fraction']:.0%}", (i, bottom[i]), ha="center", va="bottom", fontsize=9
        )
    ax.set_ylabel("time per step (ms)")
    ax.set_title("Where a training step's time goes")
    handles, names = ax.get_legend_handles_labels()  # top to bottom as the bars stack, beside them, never over
    ax.legend(handles[::-1], names[::-1], loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9, frameon=False)
    ax.margins(y=0.15)
    ax.grid(True, axis="y", alpha=0.3)
    return save(fig, path)


def sweep_plot(study: dict, path: Path) -> Path:
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    by_config: dict[str, list[dict]] = {}
    for r in _ok(study):
        by_config.setdefault(r["label"], []).append(r)
    for label, runs in by_config.items():
        runs.sort(key=lambda r: r["per_rank_batch"])
        batches = [r["per_rank_batch"] for r in runs]
        left.plot(batches, [r["samples_per_s"] for r in runs], "o-", label=label)
        right.plot(batches, [r["runtime_s"] / r["epochs"] for r in runs], "o-", label=label)
    ticks = sorted({r["per_rank_batch"] for r in _ok(study)})
    for ax, title, ylabel in ((left, "Throughput", "samples / s"), (right, "Time per epoch", "seconds")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks, [str(t) for t in ticks])
        ax.set_xlabel("batch per rank")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(f"Batch-size sweep: {study['target']}")
    return save(fig, path)


def save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=100, bbox_inches="tight")  # titles, outside legends and notes never clipped
    import matplotlib.pyplot as plt  # noqa: PLC0415 (optional dependency)

    plt.close(fig)
    return path


def make_all(study: dict, out_dir: Path) -> dict[str, str]:
    """Write every plot that has data (matplotlib is there: ``available()``); name -> path."""
    out: dict[str, str] = {}
    if not _ok(study):
        return out
    if study["spec"].get("sweep_batches"):
        out["sweep"] = str(sweep_plot(study, out_dir / "sweep.png"))
    else:
        if any(r.get("speedup") is not None for r in study["runs"]):
            out["speedup"] = str(speedup_plot(study, out_dir / "speedup.png"))
        out["throughput"] = str(throughput_plot(study, out_dir / "throughput.png"))
    made = breakdown_plot(study, out_dir / "breakdown.png")
    if made:
        out["breakdown"] = str(made)
    return out
