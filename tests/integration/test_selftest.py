"""`trainscale selftest` on this CPU machine: the gloo subset runs for real, end to end, through the
same launcher as training, and writes the files a support ticket needs. Kept small for 2-core CI:
DeepSpeed (a minute to compile on first start) is skipped, a short sweep, a 2 s hang timeout."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from trainscale.doctor.selftest import HANG_MARGIN_S

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
    assert "strategies   PASS   zero1 = ddp bitwise, fsdp" in done.stdout and "deepspeed skipped" in done.stdout
    assert "Summary: 8 passed, 0 failed" in done.stdout
    assert (tmp_path / "st" / "selftest.txt").read_text() in done.stdout
    assert (tmp_path / "st" / "logs" / "checks").is_dir() and (tmp_path / "st" / "logs" / "hang").is_dir()
