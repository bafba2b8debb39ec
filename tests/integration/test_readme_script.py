"""The README's DDP script, as printed there, runs on one process and on 2 gloo ranks through
`trainscale run`: it trains (the loss falls), prints once per epoch, logs its loss to metrics.csv, uses no
deprecated call, resumes from its checkpoint when run again, and `trainscale slurm --requeue` lints it clean."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from integration.test_run_cli import trainscale

README = Path(__file__).parents[2] / "README.md"


def readme_script() -> str:
    text = README.read_text()
    section = text[text.index("## Your script, unchanged from 1 process to N nodes") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _losses(output: str) -> list[float]:
    return [float(v) for v in re.findall(r"epoch \d: loss ([\d.]+)", output)]


def test_the_readme_script_runs_on_one_process_and_on_two_ranks(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    for where in (one, two):
        where.mkdir()
        (where / "train.py").write_text(readme_script())
    plain = subprocess.run(
        [sys.executable, "train.py"],
        cwd=one,
        capture_output=True,
        text=True,
        timeout=240,
        env={k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE"))},
    )
    ranks = trainscale("run", "--nproc-per-node", "2", "--log-dir", "logs", "train.py", cwd=two)
    for proc in (plain, ranks):
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, output
        losses = _losses(output)
        assert len(losses) == 5, output  # once per epoch: rank 0 only
        assert losses[-1] < losses[0] / 2, losses
        assert "deprecated" not in output, output
    logged = next((two / "logs").glob("*/metrics.csv")).read_text().splitlines()
    assert [row.split(",")[:2] for row in logged[1:]] == [[str(e), "loss"] for e in range(5)], logged
    assert "metrics go to" in plain.stdout and list((one / "trainscale-runs").glob("train-*/metrics.csv"))
    # one process is a run like any other: its run.json, the `latest` link, and a report naming the run itself
    (run,) = [p for p in (one / "trainscale-runs").iterdir() if p.name.startswith("train-")]
    assert (one / "trainscale-runs" / "latest").resolve() == run.resolve()
    assert (one / "trainscale-runs" / ".gitignore").read_text() == "*\n"  # never untracked files in the user's git
    record = json.loads((run / "run.json").read_text())
    assert record["command"][1:] == ["train.py"] and record["nproc_per_node"] == 1 and record["ok"] is True, record
    report = trainscale("report", "trainscale-runs/latest", cwd=one)
    assert report.returncode == 0, report.stdout + report.stderr
    assert f"Run {run.name}" in report.stdout and "Run latest" not in report.stdout, report.stdout
    assert "1 rank(s) on 1 node(s)" in report.stdout and "finished after" in report.stdout, report.stdout
    again = trainscale("run", "--nproc-per-node", "2", "--log-dir", "logs", "train.py", cwd=two)
    assert again.returncode == 0 and not _losses(again.stdout), again.stdout + again.stderr
    # the script counts epochs (rt.checkpoint(epoch + 1, ...)): the words say so
    assert "resumed from checkpoints/" in again.stdout and "at epoch 5" in again.stdout, again.stdout
    # the finished run started again trains nothing, and says so (README's examples must not do it silently)
    assert "at epoch 5 and trained nothing: the loop had no epoch left" in again.stdout, again.stdout
    assert "trained nothing" not in ranks.stdout  # the first run trained
    assert "2 rank(s) ended without training: no rank ran an optimizer step" in again.stderr, again.stderr
    report = trainscale("report", "logs/latest", cwd=two)
    assert "outcome    ended without training (no optimizer step)" in report.stdout, report.stdout


def test_requeue_lint_knows_the_readme_script_is_resumable(tmp_path):
    from trainscale.launch.slurm import SlurmJobSpec, lint

    (tmp_path / "train.py").write_text(readme_script())
    spec = SlurmJobSpec(script=str(tmp_path / "train.py"), profile="local-test", time="00:10:00", requeue=True)
    from trainscale.profiles import load_profile

    assert not [f for f in lint(spec, load_profile("local-test")) if "checkpoint through trainscale" in f.message]
