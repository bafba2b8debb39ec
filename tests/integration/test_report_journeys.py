"""From one command to the next, as README says, in one fresh directory each: `trainscale run` then the
`trainscale report` command it prints; torchrun's own `--log-dir` spelling; a sweep then its report.
Headless Chromium opens each page (screenshots in the test's output). `make demo` then `trainscale report`
on its study is checked in test_readme.py, where README runs both."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.browser import check_page, chromium, screenshot  # noqa: F401  (chromium: a fixture)
from helpers.cli import in_process

pytest.importorskip("matplotlib")

FAST_CNN = ["--data", "synthetic", "--samples", "256", "--batch-size", "16", "--log-every", "0"]


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("TRAINSCALE_", "RANK", "WORLD_SIZE", "MASTER_", "SLURM_"))
    }
    return {**env, "PYTHONUNBUFFERED": "1", **extra}


def trainscale(*args: str, cwd: Path, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainscale", *args],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def here(*args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    """The same command in this process: the run or sweep that makes the report's input (the report itself
    runs as the user's next command does)."""
    return in_process(
        *args,
        cwd=cwd,
        env={"PYTHONUNBUFFERED": "1", **env},
        drop=("TRAINSCALE_", "RANK", "WORLD_SIZE", "MASTER_", "SLURM_"),
    )


@pytest.mark.slow
def test_a_run_is_one_directory_and_the_report_command_it_prints_reads_it(tmp_path, chromium, capsys):
    """Rank 1 exits at step 6 of the first attempt; the agent restarts the group, which resumes from the
    checkpoint of step 4 written into the run directory."""
    done = here(
        "run",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--workload",
        "cnn",
        *FAST_CNN,
        "--max-steps",
        "10",
        "--checkpoint-every",
        "4",
        "--no-checkpoint-async",
        cwd=tmp_path,
        TRAINSCALE_FAULT="exit:rank=1:step=6",
        OMP_NUM_THREADS="1",
    )
    assert done.returncode == 0, done.stderr
    (runs,) = tmp_path.iterdir()  # nothing beside the one directory of runs
    (run,) = [p for p in runs.iterdir() if not p.is_symlink()]  # and one directory for this run
    assert (runs / "latest").resolve() == run.resolve()  # with its "latest" link
    assert runs.name == "trainscale-runs" and run.name.startswith("cnn-")
    assert f"run directory trainscale-runs/{run.name} (step records, every rank's logs, run.json)" in done.stderr
    assert "Resumed from" in done.stdout and str(run / "checkpoints") in done.stdout
    for attempt in ("attempt_0", "attempt_1"):
        assert {p.name for p in (run / attempt).iterdir()} == {"0", "1"}
    assert sorted(p.name for p in run.iterdir()) == [
        "attempt_0",
        "attempt_1",
        "checkpoints",
        "checkpoints.json",
        "metrics",
        "run.json",
    ]

    (command,) = [
        ln.removeprefix("trainscale: next: ") for ln in done.stderr.splitlines() if ln.startswith("trainscale: next: ")
    ]
    assert command == f"trainscale report trainscale-runs/{run.name}"
    report = trainscale(*shlex.split(command)[1:], cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    text = report.stdout
    assert "what ran   workload cnn --data synthetic" in text and "--max-restarts" in text
    assert "ranks      2 rank(s) on 1 node(s), cpu (gloo)" in text and "strategy   ddp" in text
    assert re.search(r"^0\s+\S+\s+\d+\s", text, re.M) and re.search(r"^1\s+\S+\s+\d+\s", text, re.M)
    assert "outcome    finished after" in text
    page = run / "report" / "report.html"
    assert check_page(chromium, page, tmp_path / "chrome") >= 3  # step time, time shares, utilisation
    screenshot(chromium, page, tmp_path / "chrome", run / "report" / "screenshot.png", capsys, "a run's report")


def test_torchruns_own_log_dir_spelling_holds_the_run_directory(tmp_path):
    """Seed 003's line: --redirects 3 --log-dir ../logs keeps torchrun's meaning (files only, under ../logs)."""
    work = tmp_path / "work"
    work.mkdir()
    (work / "train_llm.py").write_text("import os\nprint('hello from', os.environ['RANK'])\n")
    done = trainscale(
        "run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--redirects",
        "3",
        "--log-dir",
        "../logs",
        "train_llm.py",
        cwd=work,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "hello from" not in done.stdout  # redirected, as torchrun does
    (run,) = [p for p in (tmp_path / "logs").iterdir() if not p.is_symlink()]  # not the "latest" link
    assert run.name.startswith("train_llm-") and not (work / "trainscale-runs").exists()
    for rank in (0, 1):
        assert (run / "attempt_0" / str(rank) / "stdout.log").read_text().strip() == f"hello from {rank}"
    (command,) = [ln.removeprefix("trainscale: next: ") for ln in done.stderr.splitlines() if "next: " in ln]
    assert command == f"trainscale report ../logs/{run.name}"
    report = trainscale(*shlex.split(command)[1:], "--text", cwd=work, timeout=120)
    assert report.returncode == 0, report.stderr
    assert "what ran   script" in report.stdout and "train_llm.py" in report.stdout
    assert "[note] no step records in metrics/" in report.stdout


@pytest.mark.slow
def test_a_sweep_then_its_report(tmp_path):
    done = here(
        "sweep",
        "--local",
        "--nproc-per-node",
        "1",
        "--grid",
        "lr=1e-3,3e-4",
        "--workload",
        "cnn",
        *FAST_CNN,
        "--max-steps",
        "4",
        cwd=tmp_path,
        OMP_NUM_THREADS="1",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (sweep,) = [p.parent for p in tmp_path.rglob("sweep.json")]
    report = trainscale("report", str(sweep), cwd=tmp_path)
    assert report.returncode == 0, report.stderr
    text = report.stdout
    assert "what ran   sweep of" in text and "over lr=1e-3,3e-4: 2 task(s)" in text
    assert "[good] 2 of 2 task(s) finished" in text and re.search(r"\[good\] best by \w+: task \d \(lr=", text)
    assert re.search(r"^task\s+lr\s+state", text, re.M)
    for task in ("== task 0: lr=1e-3 ==", "== task 1: lr=3e-4 =="):  # each task's own verdict and ranks
        part = text.split(task)[1].split("\n== ")[0]
        assert re.search(r"^rank\s+host\s+steps", part, re.M), text
    assert (sweep / "report" / "report.html").is_file()
