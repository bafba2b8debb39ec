"""`trainscale report` of a 64-rank run on 8 nodes: one line per plot over a numeric rank axis instead of a
labelled bar per rank, and the 128 utilisation series (8 GPUs and 8 rank processes a node) as their median,
lowest and highest (1,024 ranks took over a minute to draw before: benchmarks/rank_costs.py)."""

from __future__ import annotations

import json

import pytest

from trainscale.report import build, plots
from trainscale.report.gather import read_run

RANKS, PER_NODE, SAMPLES = 64, 8, 30


def run_dir(tmp_path):
    metrics = tmp_path / "metrics"
    metrics.mkdir()
    for rank in range(RANKS):
        meta = {"kind": "meta", "rank": rank, "node": f"nid{rank // PER_NODE + 1}", "cpus": [rank % PER_NODE]}
        steps = [
            {
                "kind": "step",
                "step": s,
                "step_s": 0.1,
                "data_s": 0.01,
                "compute_s": 0.03,
                "backward_s": 0.04,
                "optimizer_s": 0.01,
                "samples": 16,
            }
            for s in range(30)
        ]
        (metrics / f"rank-{rank}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [meta, *steps]))
    for node in range(RANKS // PER_NODE):
        samples = [
            {
                "kind": "sample",
                "t": 1000.0 + 5 * i,
                "cpu_pct": 90.0,
                "procs": [{"pid": p, "cpu_pct": 80.0 + p, "rss": 1} for p in range(PER_NODE)],
                "gpus": [{"index": g, "util_pct": 50.0 + 5 * g} for g in range(PER_NODE)],
            }
            for i in range(SAMPLES)
        ]
        (metrics / f"node-nid{node + 1}.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    return tmp_path


def test_the_report_of_64_ranks_draws_lines_and_spreads(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    g = read_run(run_dir(tmp_path))
    series = plots.utilisation(g)
    assert sorted(series) == sorted(
        f"{what}, {name}" for what in ("GPUs", "rank processes' CPU") for name in ("median", "lowest", "highest")
    ), sorted(series)
    assert max(series["GPUs, highest"][1]) == 85.0 and min(series["GPUs, lowest"][1]) == 50.0
    drawn = {}
    save = plots.save

    def counting(fig, path):
        drawn[path.name] = sum(len(ax.patches) for ax in fig.axes)  # a bar is a patch
        return save(fig, path)

    monkeypatch.setattr(plots, "save", counting)
    build(str(tmp_path), tmp_path / "report")
    assert {"step-time.png", "time-shares.png", "utilisation.png"} <= set(drawn), drawn
    assert all(count < RANKS for count in drawn.values()), drawn  # lines, not a bar (or six) per rank
