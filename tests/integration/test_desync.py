"""issue 46 item 4: a rank that skips or adds a collective, or passes another shape, in a plain gloo script (no
trainscale import) is named with its file:line while it happens, and the run's root cause says "desync" — not
"first failing rank: 0 ... Connection closed by peer" after the gradients mixed for the rest of the run."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from helpers.cli import trainscale

SCRIPT = (Path(__file__).resolve().parents[1] / "scripts" / "desync.py").read_text()
LINE = {
    how: next(i for i, text in enumerate(SCRIPT.splitlines(), 1) if text.endswith(f"# desync: {how}"))
    for how in ("skip", "extra", "shape", "silent")
}


@pytest.mark.parametrize(
    ("how", "nproc"),
    # at 4 ranks gloo pairs rank 1's extra all-reduce with the others' next one: it completes there, and rank 1
    # goes on; its line is where the rank issued that collective (ledger.record_sites), not where it is now
    [("skip", 2), ("extra", 2), ("shape", 2), ("silent", 2), ("extra", 4)],
)
def test_a_desync_is_named_with_rank_and_line_and_ends_the_run(tmp_path, how, nproc):
    (tmp_path / "desync.py").write_text(SCRIPT)
    unset = {k: None for k in os.environ if k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "SLURM_"))}
    started = time.monotonic()
    proc = trainscale(
        tmp_path, "run", "--nproc-per-node", str(nproc), "--log-dir", "logs", "desync.py", how, timeout=150, env=unset
    )
    elapsed = time.monotonic() - started
    err = proc.stderr
    assert proc.returncode == 124, err[-4000:]
    root = next(line for line in err.splitlines() if line.startswith("Root cause:"))
    assert "rank(s) 1 called a different collective than the others (a desync)" in root, err[-4000:]
    assert "rank 0 named it" in root and "Connection closed" not in root, root
    if how == "silent":  # the same shapes: gloo mixes them; the counts at the end of the 4th optimizer step tell
        assert "by the end of step 4" in err and "(-1 against rank 0)" in err, err[-4000:]
    else:
        assert f"issued at desync.py:{LINE[how]} in <module>" in err, err[-4000:]
    assert elapsed < 120, f"took {elapsed:.0f}s"  # the loop alone runs 30 s; gloo's timeout is 30 min
    print(f"{how}: named and ended {elapsed:.0f}s after start")
