"""The tour's plan, report and doctor sections: one part of README's journey (tests/helpers/readme.py), after
README's demo study and one of its SLURM jobs, which the reports read."""

from __future__ import annotations

import json
import re
import sys

import pytest
from helpers.readme import part_fixture

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

readme = part_fixture("tour_plan")


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1200)  # the first test to run sets the part's run up
def test_readme_tune_searches_within_its_budget_and_run_takes_the_result(readme):
    """`trainscale plan --tune --budget 20` then `trainscale run --config tuned.toml`: the defaults first, the search
    within its budget, and the run trains with the best per-rank batch it wrote."""
    budget = float(re.search(r"--budget (\d+)", readme.command("trainscale plan --tune --workload cnn")).group(1))
    printed = readme.output("trainscale plan --tune --workload cnn")
    trials = re.findall(r"^\s+\d+\. (batch \d+[^\n]*?)\s{2,}(\d+) samples/s", printed, re.M)
    assert trials and trials[0][0] == "batch 16", printed  # the defaults first
    assert re.search(r"^best: ", printed, re.M), printed
    # the search stops when the next trial and the final pair would not fit: at most one trial over
    slowest = max(float(s) for s in re.findall(r"\((\d+)s\)", printed))
    if len(trials) == 1:  # a busy machine: the first trial's pace left no room for one more and the final pair
        assert 4 * (slowest + 1) > budget, printed  # (seconds printed rounded down)
    assert readme.seconds("trainscale plan --tune --workload cnn") <= budget + 3 * slowest + 30, printed
    table = tomllib.loads((readme.dir / "tuned.toml").read_text())["train"]
    assert f"2 rank(s) x batch {table['batch_size']}," in readme.output(
        "trainscale run --nproc-per-node 2 --workload cnn --epochs 1 --config tuned.toml"
    )
    (run,) = [
        p.parent
        for p in (readme.dir / "trainscale-runs").glob("*/run.json")
        if not p.parent.is_symlink() and "tuned.toml" in json.loads(p.read_text())["command"]
    ]
    with open(run / "metrics" / "rank-0.jsonl") as fh:
        meta = json.loads(fh.readline())  # what the ranks trained with
    assert meta["batch_size"] == table["batch_size"]
    assert meta["strategy"] == table.get("strategy", "ddp").split(":")[0]
