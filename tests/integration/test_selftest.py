"""`trainscale selftest`'s hang row on four ranks. The whole command on this CPU machine and on the SLURM
cluster is README's (tests/integration/test_readme.py reads its report, tables and ticket files)."""

from __future__ import annotations

import pytest
from helpers.cli import in_process

from trainscale.doctor.selftest import hang_record, hang_row
from trainscale.doctor.selftest_rank import HOLD




@pytest.mark.slow
def test_the_hang_row_passes_on_four_ranks_when_the_launcher_ends_rank_0_before_it_records(tmp_path):
    """Every healthy rank names the hang at its own moment, and the first to end makes the launcher end
    the rest: rank 0, held here before it records (as when its heartbeat ticks last), is ended first.
    Only rank 0 used to record, and the row said "no rank reported a named error" (issue 22 item 1)."""
    out = tmp_path / "hang.json"
    done = in_process("run", "--nproc-per-node", "4", "--log-dir", "logs", "-m", "trainscale.doctor.selftest_rank",
                      "hang", "--out", str(out), "--workdir", "work", "--timeout", "3", cwd=tmp_path, env={HOLD: "0"},
                      drop=("RANK", "WORLD_SIZE", "MASTER_", "SLURM_", "TRAINSCALE_FAULT", "TRAINSCALE_CPU_BIND"))
    assert done.returncode != 0
    row = hang_row(out, 3.0, (False, done.stderr))
    assert row["status"] == "pass", row
    assert not hang_record(out, 0).exists() and row["detail"]["rank"] != 0  # rank 0 never got to record
    assert "rank 3 named with its stack by rank" in row["figure"] and "in stop_participating" in row["detail"]["message"]
    assert "Root cause: rank(s) 3 hung (stopped participating)" in done.stderr  # the launcher's summary
