"""README's own commands, the first part of README's journey (tests/helpers/readme.py: the parts, what each
needs first, the commands skipped or replaced); the tour's parts are test_readme_tour_*.py."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.browser import check_page, chromium, screenshot  # noqa: F401  (chromium: a fixture)
from helpers.readme import (
    LONGEST_FIRST,
    NEEDS,
    PARTS,
    README,
    REPLACED,
    SKIPPED,
    key,
    module,
    needed,
    part_commands,
    part_fixture,
    parts_of,
    pasted,
)

readme = part_fixture("readme")


def test_every_readme_command_is_placed():
    """Every command of README and the tour is in exactly one part (a new section no part names fails here);
    what SKIPPED, REPLACED and NEEDS name is still there (else the tables are stale)."""
    found = pasted()
    unplaced = [(page, heading, key(c)) for page, heading, c in found if len(parts_of(page, heading)) != 1]
    assert not unplaced, f"in no part, or in several (tests/helpers/readme.py PARTS): {unplaced}"
    keys = {key(c) for _, _, c in found}
    assert set(SKIPPED) | set(REPLACED) <= keys, (set(SKIPPED) | set(REPLACED)) - keys
    assert len(keys) >= 40  # the command lines, not a handful
    assert sum(len(part_commands(part)) for part in PARTS) == len(found)
    for part in NEEDS:
        assert len(needed(part)) == len(NEEDS[part])  # each found once, in an earlier part
    assert sorted(LONGEST_FIRST) == sorted(PARTS)
    for part in PARTS:  # each part is a module of its own: the test processes run them side by side
        assert f'part_fixture("{part}")' in (Path(__file__).parent / module(part)).read_text(), module(part)


def test_readme_is_short():
    """A newcomer reads README in five minutes: at most 200 lines, the rest in docs/ (issue 38)."""
    assert len(README.read_text().splitlines()) <= 200


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1200)  # the first test to run sets the part's run up
def test_readme_commands_run_in_order_in_one_fresh_directory(readme, chromium, capsys):
    tmp_path, done, env = readme.dir, readme.done, readme.env
    # what the README promises the commands leave behind, for the next command a reader types
    # make demo's study with the page `trainscale report bench-out/latest` drew right after it
    (demo,) = [p for p in (tmp_path / "bench-out").glob("demo-*") if not p.is_symlink()]
    assert (demo / "report" / "report.html").is_file(), demo
    assert (tmp_path / "bench-out" / "latest").resolve() == demo.resolve()
    assert (tmp_path / "trainscale-runs" / "latest" / "run.json").is_file()

    # make demo then `trainscale report` on its study, as the demo's last line says
    assert f"next: trainscale report bench-out/{demo.name}   (the page" in done.stdout
    for name in ("01-1", "02-2"):  # one directory per configuration: its records, logs, what ran
        run = demo / "runs" / name
        assert (run / "metrics" / "rank-0.jsonl").is_file() and (run / "run.json").is_file()
        assert (run / "attempt_0" / "0" / "stdout.log").is_file() and (run / "metrics.json").is_file()
    report = subprocess.run(
        [sys.executable, "-m", "trainscale", "report", demo],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0, report.stderr
    text = report.stdout
    assert (
        "what ran   scaling study of workload cnn: a fixed problem: 2 epoch(s) at each size, per-rank batch 16 "
        "(the global batch grows with the ranks)" in text
    )
    assert re.search(r"versions\s+trainscale \S+, torch \S+, python \S+", text) and "host       " in text
    assert re.search(r"^\[(problem|note|good)\] DDP 2 CPU ranks: ", text, re.M), text  # the study's verdict
    assert re.search(r"^Single CPU rank\s+1\s", text, re.M) and re.search(r"^DDP 2 CPU ranks\s+2\s", text, re.M)
    for section in ("== Single CPU rank (01-1) ==", "== DDP 2 CPU ranks (02-2) =="):  # each one's own verdict
        part = text.split(section)[1].split("\n== ")[0]
        assert re.search(r"^\[(problem|note|good)\] ", part, re.M) and re.search(r"^rank\s+host\s+steps", part, re.M)
    assert "(no plots" not in text and "matplotlib is not installed" not in text
    for png in ("speedup.png", "throughput.png", "breakdown.png"):
        assert "plot: " in text and png in text
    page = demo / "report" / "report.html"
    assert check_page(chromium, page, tmp_path / "chrome") >= 3  # the study's speedup, throughput, breakdown
    screenshot(
        chromium,
        page,
        tmp_path / "chrome",
        demo / "report" / "screenshot.png",
        capsys,
        "`make demo`'s study report",
        height=4200,
    )


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1200)  # the first test to run sets the part's run up
def test_readme_workload_job_trains_on_two_nodes_of_two_ranks(readme):
    """`trainscale slurm ... --submit --watch --workload cnn` (torchrun mode; srun mode is in
    tests/slurm/test_preemption.py): the job completed, and rank 0's log, read with `trainscale jobs`, shows
    the workload saw 4 ranks and trained."""
    printed = readme.output("trainscale slurm --profile local-test -N 2 --gpus-per-node 2 -t 00:10:00 --submit")
    job = re.search(r"^Job (\d+) \(trainscale-cnn\) COMPLETED", printed, re.M)
    assert job, printed
    said = readme.output("trainscale slurm --profile local-test -N 2 --gpus-per-node 2 -t 00:10:00 --submit", "stderr")
    assert f"trainscale slurm: next: trainscale report {job.group(1)}" in said, said  # --watch ends with the next step
    log0 = readme.trainscale("jobs", job.group(1), "--rank", "0")
    assert log0.returncode == 0, log0.stderr
    assert "4 rank(s) x batch 16" in log0.stdout and re.search(r"Epoch 1: loss [\d.]+", log0.stdout), log0.stdout


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1200)  # the first test to run sets the part's run up
def test_readme_plan_answers_in_a_minute_and_its_verify_measures_what_it_predicted(readme):
    """README's plan for 4 LUMI nodes (calibrated here) fits and names the line that submits it; `--verify` runs
    2 ranks of train.py here and the held bytes it predicted are what the ranks held (issue 37)."""
    line = "trainscale plan --nproc-per-node 8 --nodes 4 --profile lumi train.py"
    lumi = readme.output(line)
    assert "Recommended: --strategy ddp (it fits" in lumi and "Submit: trainscale slurm --profile lumi -N 4" in lumi
    assert readme.seconds(line) < 60, readme.seconds(line)
    checked = readme.output("trainscale plan --nproc-per-node 2 --verify train.py")
    row = re.search(r"^2 x your script \(ddp\)\s.*$", checked, re.M)
    assert row, checked
    # the model state's error (after its predicted and measured sizes; the step's may be "too uncertain", no error)
    held = re.search(r"\d+\.\d \w+\s+\d+\.\d \w+\s+([+-]\d+\.\d%)", row.group(0))
    assert held and held.group(1) == "+0.0%", row.group(0)  # held: predicted = measured
