"""One self-contained HTML page (the PNGs beside it and embedded in it), and the same in text.

The page checks itself when a browser opens it: a small script marks ``<body data-report="ok">`` once
every plot image has loaded, and records any script error in ``data-errors`` (the browser test in
tests/integration/test_report.py reads both).
"""

from __future__ import annotations

import base64
import html
import statistics
from pathlib import Path

from trainscale.report.gather import Gathered
from trainscale.report.verdict import findings

COLOURS = {"data": "#8da0cb", "compute": "#66c2a5", "backward": "#a6d854", "optimizer": "#e78ac3", "comm": "#fc8d62",
           "other": "#b3b3b3"}
CHECK = """<script>
(function () {
  var errors = [];
  window.addEventListener('error', function (e) { errors.push(String(e.message || e)); });
  function done() {
    var imgs = Array.prototype.slice.call(document.querySelectorAll('img.plot'));
    var bad = imgs.filter(function (i) { return !(i.complete && i.naturalWidth > 0); });
    document.body.setAttribute('data-plots', String(imgs.length - bad.length));
    document.body.setAttribute('data-errors', errors.join(' | '));
    document.body.setAttribute('data-report', bad.length === 0 && errors.length === 0 ? 'ok' : 'broken');
  }
  if (document.readyState === 'complete') { done(); } else { window.addEventListener('load', done); }
})();
</script>"""


def _plt():
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plots(g: Gathered, out: Path) -> dict[str, Path]:
    """The report's PNGs (none when matplotlib is not installed: the page then has tables only)."""
    plt = _plt()
    made: dict[str, Path] = {}
    if plt is None:
        return made
    if g.ranks:
        _rank_plots(g, out, plt, made)
    study = g.study or {}
    measured = [r for r in study.get("runs", []) if r.get("status") == "ok" and r.get("prediction")]
    if measured:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        xs = [str(r["world_size"]) for r in measured]
        ax.plot(xs, [r["prediction"]["measured_step_s"] * 1e3 for r in measured], "o-", label="measured")
        ax.plot(xs, [r["prediction"]["step_s"] * 1e3 for r in measured], "s--", label="predicted")
        ax.set_xlabel("ranks")
        ax.set_ylabel("step time after the first epoch (ms)")
        ax.set_title("Scaling model: measured and predicted")
        ax.legend()
        made["projection"] = _save(fig, out / "measured-vs-predicted.png", plt)
    return made


MANY = 32
"""Above this many ranks (or utilisation series) a plot gets a numeric rank axis and the series their median
and range: 1,024 labelled bars and a 1,024-entry legend took over a minute to draw (benchmarks/rank_costs.py)."""


def _rank_plots(g: Gathered, out: Path, plt, made: dict[str, Path]) -> None:
    many = len(g.ranks) > MANY  # one line over a numeric rank axis, not a labelled bar per rank
    ranks = [r.rank if many else str(r.rank) for r in g.ranks]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    medians, p90s = [r.step_median_s * 1e3 for r in g.ranks], [r.step_p90_s * 1e3 for r in g.ranks]
    if many:
        ax.plot(ranks, medians, color="#1b9e77", lw=0.8, label="median")
        ax.plot(ranks, p90s, ".", color="#d95f02", ms=2, label="p90")
    else:
        ax.bar(ranks, medians, color="#1b9e77", label="median")
        ax.scatter(ranks, p90s, color="#d95f02", zorder=3, label="p90")
    ax.set_xlabel("rank")
    ax.set_ylabel("step time (ms)")
    ax.set_title("Step time per rank")
    ax.legend()
    made["step_time"] = _save(fig, out / "step-time.png", plt)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    bottom = [0.0] * len(ranks)
    if many:
        ax.stackplot(ranks, *[[r.shares[key] * 1e3 for r in g.ranks] for key in COLOURS],
                     colors=list(COLOURS.values()), labels=list(COLOURS))
    for key, colour in COLOURS.items() if not many else ():
        values = [r.shares[key] * 1e3 for r in g.ranks]
        ax.bar(ranks, values, bottom=bottom, color=colour, label=key)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_xlabel("rank")
    ax.set_ylabel("ms per step")
    ax.set_title("Where each rank's step goes")
    ax.legend(ncol=4, fontsize=8)
    made["shares"] = _save(fig, out / "time-shares.png", plt)
    series = _utilisation(g)
    if series:
        fig, ax = plt.subplots(figsize=(7, 3.5))
        for label, (ts, values) in series.items():
            ax.plot(ts, values, label=label)
        ax.set_xlabel("seconds since the first sample")
        ax.set_ylabel("utilisation (%)")
        ax.set_ylim(0, max(100, max(max(v) for _, v in series.values()) * 1.05))
        ax.set_title("Utilisation over time")
        ax.legend(fontsize=7, ncol=2)
        made["utilisation"] = _save(fig, out / "utilisation.png", plt)


def _utilisation(g: Gathered) -> dict[str, tuple[list[float], list[float]]]:
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


def _save(fig, path: Path, plt) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _table(head: list[str], rows: list[list[str]]) -> str:
    cells = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{cells}</tr></thead><tbody>{body}</tbody></table>"


def rank_rows(g: Gathered) -> tuple[list[str], list[list[str]]]:
    head = ["rank", "host", "steps", "step median (ms)", "p90 (ms)", "data", "forward", "backward", "optimizer", "comm",
            "samples/s", "tokens/s", "MFU", "peak memory"]
    rows = []
    for r in g.ranks:
        step = r.step_median_s or 1.0
        rows.append([str(r.rank), r.host, str(r.steps), f"{r.step_median_s * 1e3:.1f}", f"{r.step_p90_s * 1e3:.1f}",
                     *(f"{r.shares[k] / step:.0%}" for k in ("data", "compute", "backward", "optimizer", "comm")),
                     f"{r.samples_per_s:.0f}" if r.samples_per_s else "-", f"{r.tokens_per_s:.0f}" if r.tokens_per_s else "-",
                     f"{r.mfu:.1%}" if r.mfu is not None else "-",
                     f"{r.peak_mem_bytes / 2**20:.0f} MiB" if r.peak_mem_bytes else "-"])
    return head, rows


def render_html(g: Gathered, images: dict[str, Path]) -> str:
    found = findings(g)
    verdict = "".join(f'<li class="{f.level}">{html.escape(f.text)}</li>' for f in found)
    parts = [f"<h1>trainscale report: {html.escape(str(g.source))}</h1>", f'<ul class="verdict">{verdict}</ul>']
    if g.ranks:
        head, rows = rank_rows(g)
        parts += ["<h2>Ranks</h2>", _table(head, rows)]
    titles = {"step_time": "Step time per rank", "shares": "Time shares", "utilisation": "Utilisation over time",
              "projection": "Scaling model"}
    for key, path in images.items():
        data = base64.b64encode(path.read_bytes()).decode()
        parts.append(f'<h2>{titles.get(key, key)}</h2><img class="plot" alt="{key}" src="data:image/png;base64,{data}">')
    if not images:
        parts.append("<p>(no plots: matplotlib is not installed)</p>")
    if g.accounting or g.accounting_note:
        acct = g.accounting or {}
        rows = [[k, str(acct.get(k, ""))] for k in ("State", "Elapsed", "AllocCPUS", "TotalCPU", "MaxRSS", "NNodes")
                if k in acct]
        if acct.get("cpu_efficiency") is not None:
            rows.append(["CPU efficiency", f"{acct['cpu_efficiency']:.0%}"])
        parts += ["<h2>SLURM accounting</h2>", _table(["field", "value"], rows) if rows else
                  f"<p>{html.escape(g.accounting_note)}</p>"]
    if g.study:
        from trainscale.bench.results import markdown_table, model_check

        table = [line.strip("|").split("|") for line in markdown_table(g.study).splitlines()]
        parts += ["<h2>Scaling study</h2>", _table([c.strip() for c in table[0]], [[c.strip() for c in r] for r in table[2:]])]
        if model_check(g.study):
            parts.append(f"<p>{html.escape(model_check(g.study))}</p>")
    style = ("body{font-family:sans-serif;max-width:1000px;margin:2em auto;color:#222}table{border-collapse:collapse}"
             "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px}li.problem{color:#b00}li.good{color:#070}"
             "img.plot{max-width:100%}")
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>trainscale report</title><style>{style}</style>"
            f"</head><body>{''.join(parts)}{CHECK}</body></html>\n")


def render_text(g: Gathered) -> str:
    lines = [f"trainscale report: {g.source}", ""]
    lines += [f"[{f.level}] {f.text}" for f in findings(g)]
    if g.ranks:
        head, rows = rank_rows(g)
        widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
        lines += ["", *("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in (head, *rows))]
    if g.accounting:
        eff = g.accounting.get("cpu_efficiency")
        lines += ["", f"SLURM: {g.accounting.get('State')} after {g.accounting.get('Elapsed')}, "
                      f"MaxRSS {g.accounting.get('MaxRSS') or '-'}" + (f", CPU efficiency {eff:.0%}" if eff else "")]
    elif g.accounting_note:
        lines += ["", f"SLURM accounting: {g.accounting_note}"]
    if g.ranks:
        steps = statistics.median(r.step_median_s for r in g.ranks)
        lines.append(f"median step {steps * 1e3:.1f} ms over {len(g.ranks)} rank(s)")
    if g.study:
        from trainscale.bench.results import markdown_table, model_check

        lines += ["", markdown_table(g.study)] + ([model_check(g.study)] if model_check(g.study) else [])
    return "\n".join(lines) + "\n"


def write_report(g: Gathered, out: Path) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    images = plots(g, out)
    page = out / "report.html"
    page.write_text(render_html(g, images))
    (out / "report.txt").write_text(render_text(g))
    return {"html": page, "text": out / "report.txt", **images}
