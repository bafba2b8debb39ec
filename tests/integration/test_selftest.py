"""`trainscale selftest` on this CPU machine: the gloo subset runs for real, end to end, through the
same launcher as training, and writes the files a support ticket needs. Kept small for 2-core CI:
DeepSpeed (a minute to compile on first start) is skipped, a short sweep, a 2 s hang timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from trainscale.doctor.selftest import HANG_MARGIN_S, hang_record, hang_row
from trainscale.doctor.selftest_rank import HOLD

CHECKS = ["devices", "all-reduce", "equivalence", "strategies", "resume", "breakdown", "binding", "hang"]


def test_the_cpu_subset_passes_and_writes_the_ticket_files(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "SLURM_",
                                                                   "TRAINSCALE_FAULT", "TRAINSCALE_CPU_BIND"))}
    done = subprocess.run([sys.executable, "-m", "trainscale", "selftest", "--out", "st", "--skip", "deepspeed",
                           "--hang-timeout", "2", "--sizes", "1MB,4MB"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    report = json.loads((tmp_path / "st" / "selftest.json").read_text())
    rows = {c["name"]: c for c in report["checks"]}
    assert list(rows) == CHECKS and all(c["status"] == "pass" for c in rows.values()), rows
    assert report["meta"]["world_size"] == 2 and report["meta"]["backend"] == "gloo"
    # the figures a ticket needs: bandwidth, equivalence, time to the named error
    assert rows["all-reduce"]["detail"]["plateau"]["busbw_Bps"] > 0
    assert rows["equivalence"]["detail"]["max_rel"] <= 1e-6
    assert rows["resume"]["detail"]["bitwise"] is True
    assert rows["breakdown"]["detail"]["communication_total"] > 0
    hang = rows["hang"]["detail"]
    assert "rank(s) 1 did not arrive" in hang["message"] and 2.0 <= hang["seconds"] <= 2.0 + HANG_MARGIN_S
    assert hang["stack"] and "in stop_participating" in hang["message"]  # the hung rank's stack, from its heartbeat
    assert "strategies   PASS   zero1 = ddp bitwise, fsdp" in done.stdout and "deepspeed skipped" in done.stdout
    assert "Summary: 8 passed, 0 failed" in done.stdout
    assert (tmp_path / "st" / "selftest.txt").read_text() in done.stdout
    assert (tmp_path / "st" / "logs" / "checks").is_dir() and (tmp_path / "st" / "logs" / "hang").is_dir()


def _clean_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "SLURM_",
                                                                          "TRAINSCALE_FAULT", "TRAINSCALE_CPU_BIND"))},
            **extra}


@pytest.mark.slow
def test_the_hang_row_passes_on_four_ranks_when_the_launcher_ends_rank_0_before_it_records(tmp_path):
    """Every healthy rank names the hang at its own moment, and the first to end makes the launcher end
    the rest: rank 0, held here before it records (as when its heartbeat ticks last), is ended first.
    Only rank 0 used to record, and the row said "no rank reported a named error" (issue 22 item 1)."""
    out = tmp_path / "hang.json"
    done = subprocess.run([sys.executable, "-m", "trainscale", "run", "--nproc-per-node", "4", "--log-dir", "logs",
                           "-m", "trainscale.doctor.selftest_rank", "hang", "--out", str(out), "--workdir", "work",
                           "--timeout", "3"], cwd=tmp_path, env=_clean_env(**{HOLD: "0"}),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    row = hang_row(out, 3.0, (False, done.stderr))
    assert row["status"] == "pass", row
    assert not hang_record(out, 0).exists() and row["detail"]["rank"] != 0  # rank 0 never got to record
    assert "rank 3 named with its stack by rank" in row["figure"] and "in stop_participating" in row["detail"]["message"]
    assert "Root cause: rank(s) 3 hung (stopped participating)" in done.stderr  # the launcher's summary
