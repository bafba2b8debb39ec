"""`trainscale selftest`'s hang row on four ranks. The whole command on this CPU machine and on the SLURM
cluster is the tour's (tests/integration/test_readme_tour_selftest.py reads its report, tables and ticket files)."""

from __future__ import annotations

import json

import pytest
from helpers.cli import in_process

from trainscale.selftest.rank import HOLD
from trainscale.selftest.run import hang_record, hang_row

DROP = ("RANK", "WORLD_SIZE", "MASTER_", "SLURM_", "TRAINSCALE_FAULT", "TRAINSCALE_CPU_BIND")


@pytest.mark.slow
def test_the_equivalence_row_passes_on_a_world_size_that_does_not_divide_32(tmp_path):
    """Issue 39 item 3: the global batch was 32 whatever the world size, so 3 ranks trained on 30 samples while
    the one-process reference trained on 32 and a healthy 3-node x 8-GPU cluster (24 ranks) failed the row."""
    done = in_process(
        "selftest",
        "--nproc",
        "3",
        "--skip",
        "all-reduce,strategies,resume,breakdown,binding,hang",
        "--out",
        str(tmp_path / "out"),
        "--json",
        cwd=tmp_path,
        drop=DROP,
    )
    rows = {row["name"]: row for row in json.loads((tmp_path / "out" / "selftest.json").read_text())["checks"]}
    assert rows["equivalence"]["status"] == "pass", (rows["equivalence"], done.stderr[-2000:])
    assert "DDP on 3 ranks" in rows["equivalence"]["figure"] and done.returncode == 0


@pytest.mark.slow
def test_the_breakdown_row_reads_the_all_reduce_from_the_step_records(tmp_path):
    """The breakdown row is the step records' (observe/hooks.py, observe/reading.py): on 2 gloo ranks the exposed
    all-reduce of 25.2 MB of gradients, compared with the bus bandwidth the all-reduce row measured."""
    done = in_process(
        "selftest",
        "--nproc",
        "2",
        "--skip",
        "equivalence,strategies,resume,binding,hang",
        "--out",
        str(tmp_path / "out"),
        "--json",
        cwd=tmp_path,
        drop=DROP,
    )
    rows = {row["name"]: row for row in json.loads((tmp_path / "out" / "selftest.json").read_text())["checks"]}
    row = rows["breakdown"]
    assert row["status"] in ("pass", "warn"), (row, done.stderr[-2000:])  # warn: CPU ranks share their cores
    assert row["detail"]["communication"] > 0 and row["detail"]["backward"] > 0 and row["detail"]["implied_s"] > 0
    assert row["figure"].startswith("communication exposed ")


@pytest.mark.slow
def test_the_hang_row_passes_on_four_ranks_when_the_launcher_ends_rank_0_before_it_records(tmp_path):
    """Every healthy rank names the hang at its own moment, and the first to end makes the launcher end
    the rest: rank 0, held here before it records (as when its heartbeat ticks last), is ended first.
    Only rank 0 used to record, and the row said "no rank reported a named error" (issue 22 item 1)."""
    out = tmp_path / "hang.json"
    done = in_process(
        "run",
        "--nproc-per-node",
        "4",
        "--log-dir",
        "logs",
        "-m",
        "trainscale.selftest.rank",
        "hang",
        "--out",
        str(out),
        "--workdir",
        "work",
        "--timeout",
        "3",
        cwd=tmp_path,
        env={HOLD: "0"},
        drop=DROP,
    )
    assert done.returncode != 0
    row = hang_row(out, 3.0, (False, done.stderr))
    assert row["status"] == "pass", row
    assert not hang_record(out, 0).exists() and row["detail"]["rank"] != 0  # rank 0 never got to record
    assert (
        "rank 3 named with its stack by rank" in row["figure"] and "in stop_participating" in row["detail"]["message"]
    )
    assert "Root cause: rank(s) 3 hung (stopped participating)" in done.stderr  # the launcher's summary
