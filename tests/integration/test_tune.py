"""`trainscale plan --tune` refusing before or at its first trial. The search within its budget and `trainscale run`
training with the file it wrote are the tour's commands (tests/integration/test_readme_tour_plan.py)."""

from __future__ import annotations

import os
import subprocess
import sys


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("TRAINSCALE_")}


def test_defaults_that_do_not_run_stop_the_search(tmp_path):
    (tmp_path / "tmp").mkdir()
    env = {
        **_env(),
        "TRAINSCALE_FAULT": "raise:rank=0:step=1",  # every trial fails in its first step
        "TMPDIR": str(tmp_path / "tmp"),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainscale",
            "plan",
            "--tune",
            "--workload",
            "cnn",
            "--budget",
            "60",
            "--max-steps",
            "5",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "the defaults do not run" in done.stderr, done.stderr + done.stdout
    assert not (tmp_path / "tuned.toml").exists()
    assert not list((tmp_path / "tmp").glob("trainscale-*"))  # the trials' metrics and logs went with the search


def test_a_strategy_option_that_does_not_exist_is_refused_before_any_trial(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainscale",
            "plan",
            "--tune",
            "--workload",
            "cnn",
            "--strategy",
            "ddp:bogus=1",
            "--budget",
            "60",
            "--max-steps",
            "5",
        ],
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "has no option 'bogus'" in done.stderr, done.stderr + done.stdout
    assert "trial" not in done.stdout.lower() and not (tmp_path / "tuned.toml").exists()
