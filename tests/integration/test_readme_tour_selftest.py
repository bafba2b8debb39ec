"""The tour's selftest and trackers sections: one part of README's journey (tests/helpers/readme.py), its
SLURM line on the two-node test cluster."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers.readme import Readme, part_fixture

from trainscale.selftest.run import HANG_MARGIN_S

SELFTEST_CHECKS = ["devices", "all-reduce", "equivalence", "strategies", "resume", "breakdown", "binding", "hang"]

readme = part_fixture("tour_selftest")


def _selftest(readme: Readme, nodes: int) -> tuple[Path, dict, dict]:
    """README's selftest on ``nodes`` node(s) (both write under selftest-out/): its directory, report and rows."""
    found = [(p.parent, json.loads(p.read_text())) for p in (readme.dir / "selftest-out").glob("*/selftest.json")]
    ((directory, report),) = [(d, r) for d, r in found if r["meta"]["num_nodes"] == nodes]
    return directory, report, {c["name"]: c for c in report["checks"]}


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1200)  # the first test to run sets the part's run up
def test_readme_selftest_passes_every_cpu_check_and_writes_the_ticket_files(readme):
    """`trainscale selftest --skip deepspeed`: the gloo subset, end to end, through the training launcher."""
    directory, report, rows = _selftest(readme, 1)
    # breakdown compares two timings (the step's communication vs the bus bandwidth measured before it): on
    # cores shared with other work they may disagree, and it warns; every other check must pass
    assert list(rows) == SELFTEST_CHECKS and all(c["status"] == "pass" for n, c in rows.items() if n != "breakdown"), (
        rows
    )
    assert rows["breakdown"]["status"] in ("pass", "warn"), rows["breakdown"]
    assert report["meta"]["world_size"] == 2 and report["meta"]["backend"] == "gloo"
    # the figures a ticket needs: bandwidth, equivalence, time to the named error
    assert rows["all-reduce"]["detail"]["plateau"]["busbw_Bps"] > 0
    assert rows["equivalence"]["detail"]["max_rel"] <= 1e-6
    assert rows["resume"]["detail"]["bitwise"] is True
    assert rows["breakdown"]["detail"]["communication"] > 0  # the exposed all-reduce, from the step records
    hang = rows["hang"]["detail"]  # README keeps the default --hang-timeout 10
    assert "rank(s) 1 did not arrive" in hang["message"] and 10.0 <= hang["seconds"] <= 10.0 + HANG_MARGIN_S
    assert hang["stack"] and "in stop_participating" in hang["message"]  # the hung rank's stack, from its heartbeat
    printed = readme.output("trainscale selftest --skip deepspeed")
    assert "strategies   PASS   zero1 = ddp bitwise, fsdp" in printed and "deepspeed skipped" in printed
    assert re.search(r"Summary: [78] passed, 0 failed", printed), printed
    assert (directory / "selftest.txt").read_text() in printed
    assert (directory / "logs" / "checks").is_dir() and (directory / "logs" / "hang").is_dir()


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1200)  # the first test to run sets the part's run up
def test_readme_selftest_on_slurm_runs_two_jobs_and_reports_every_check(readme):
    """`trainscale selftest --slurm`: both launches are real batch jobs made by `trainscale slurm`'s plan, lint
    and submission; the hang job fails as it must, naming the stopped rank."""
    _, report, rows = _selftest(readme, 2)
    assert report["meta"]["world_size"] == 4
    assert all(c["status"] in ("pass", "warn") for c in rows.values()), rows  # binding depends on the profile
    assert "rank(s) 3 did not arrive" in rows["hang"]["detail"]["message"]
    assert "in stop_participating" in rows["hang"]["detail"]["message"]  # its stack, through the store of a 2-node job
    assert readme.output("trainscale selftest --slurm", "stderr").count("submitted job") == 2
