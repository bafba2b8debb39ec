"""The tour's `trainscale run`, workloads and strategies sections: one part of README's journey
(tests/helpers/readme.py), on this machine's CPU ranks."""

from __future__ import annotations

import json

import pytest
from helpers.readme import part_fixture

readme = part_fixture("tour_run")


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the first test to run sets the part's run up
def test_tour_runs_every_workload_and_strategy_each_in_its_run_directory(readme):
    """Each run kept its directory and trained; seed 003's line put its own under --log-dir, and gpt's second
    line resumed the first's checkpoint at step 20."""
    seed003 = [p for p in (readme.dir / "seed003" / "logs").glob("*/run.json") if not p.parent.is_symlink()]
    assert len(seed003) == 1, seed003
    runs = [p for p in (readme.dir / "trainscale-runs").glob("*/run.json") if not p.parent.is_symlink()]
    records = [json.loads(p.read_text()) for p in runs + seed003]
    # cnn, seed 003's script, the module, vit, gpt twice, hf-finetune, fsdp, deepspeed
    assert len(records) == 9 and all(r["ok"] for r in records), [(r.get("command"), r.get("ok")) for r in records]
    resumed = readme.output("trainscale run --nproc-per-node 2 --workload gpt --max-steps 30")
    assert "Resumed from " in resumed and " at step 20 " in resumed, resumed
    assert (readme.dir / "runs" / "fsdp").is_dir() and (readme.dir / "runs" / "ds").is_dir()
