"""The study's live table keeps each run's last epoch in its "Last" column."""

from __future__ import annotations

import io

from rich.console import Console

from trainscale.bench.display import Row, StudyDisplay


def test_the_last_column_keeps_the_epoch_not_the_memory_table_printed_after_it():
    out = io.StringIO()
    display = StudyDisplay("study", [Row("r1", "ddp", 2, 16, 2)], console=Console(file=out, width=200))
    with display:
        display.start("r1")
        with display.capture("r1"):
            print("[rank0]: cnn: 1,234 parameters, 2 rank(s) x batch 16")
            print("[rank0]: Epoch 1: loss 0.6931, held-out loss 0.6, accuracy 51.2%, time 1.0s")
            print("[rank0]: memory per rank (ddp), MiB; peak = process peak RSS")
            print("[rank0]:       total                  0.23       0.23       0.23       0.69")
            print("trainscale: 2 rank(s) finished in 3.1s; run directory x")
        display.finish("r1", ok=True)
    row = display.rows["r1"]
    assert row.detail == "loss 0.6931, accuracy 51.2%" and row.epoch == 2
    assert "bench: r1 ok in" in out.getvalue() and "loss 0.6931, accuracy 51.2%" in out.getvalue()
