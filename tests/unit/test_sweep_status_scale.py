"""`trainscale sweep status` of a 64-task sweep: every task in the table, the plot of the best 30 only (a bar
per task of a 1,024-task sweep took 16 s to draw and was unreadable: benchmarks/rank_costs.py)."""

from __future__ import annotations

import json
import struct

import pytest

from trainscale.cli.sweep import status

TASKS = 64


def test_sweep_status_of_64_tasks_plots_the_best_30(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    configs = [{"lr": f"{1e-3 / (1 + i):.3e}", "seed": str(i)} for i in range(TASKS)]
    (tmp_path / "sweep.json").write_text(json.dumps({"grid": {}, "configurations": configs, "jobs": ["7"]}))
    for i in range(TASKS):
        task = tmp_path / f"task-{i}"
        task.mkdir()
        (task / "finished").write_text("done\n")
        (task / "metrics.json").write_text(json.dumps({"epochs": [{"test_loss": 1.0 + (i * 37 % TASKS) / 100}]}))
    assert status([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"{TASKS} of {TASKS} task(s) finished; best first by test_loss" in out
    rows = [line.split()[0] for line in out.splitlines()[1 : TASKS + 1]]
    assert len(rows) == TASKS and rows[0] == "0"  # task 0 has the lowest loss
    width, height = struct.unpack(">II", (tmp_path / "results.png").read_bytes()[16:24])  # the PNG's IHDR
    assert width <= 30 * 0.9 * 100 and height <= 1000, (width, height)  # 30 bars, not 64
