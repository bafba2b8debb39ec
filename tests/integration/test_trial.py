"""launch/trial.py: a short run launched in this process leaves the caller as it found it, gives up at its
timeout by stopping its ranks (not the caller), and runs one at a time."""

from __future__ import annotations

import json
import os
import signal
import threading

import pytest
from helpers.cli import wait_for

from trainscale.errors import LaunchError
from trainscale.launch.trial import here

STUCK = """
import json, os, sys, time
with open(sys.argv[1], "w") as f:
    json.dump({"cwd": os.getcwd(), "asked": os.environ.get("TRIAL_ASKED"), "removed": os.environ.get("TRIAL_GONE")}, f)
time.sleep(600)  # a run that never reaches its steps
"""


def test_a_trial_past_its_timeout_stops_its_ranks_and_leaves_the_caller_as_it_was(tmp_path, monkeypatch):
    (tmp_path / "stuck.py").write_text(STUCK)
    (tmp_path / "work").mkdir()
    monkeypatch.setenv("TRIAL_GONE", "the caller's")
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}
    cwd, seen = os.getcwd(), tmp_path / "seen.json"
    second: list[BaseException] = []

    def another_at_the_same_time() -> None:  # once the first trial's rank runs
        wait_for(seen.exists, 120, "the first trial's rank")
        try:
            here(str(tmp_path / "stuck.py"), (str(tmp_path / "other.json"),), run_dir=tmp_path / "other")
        except LaunchError as exc:
            second.append(exc)

    other = threading.Thread(target=another_at_the_same_time)
    other.start()
    done = here(
        str(tmp_path / "stuck.py"),
        (str(seen),),
        run_dir=tmp_path / "run",
        timeout_s=10,
        env={"TRIAL_ASKED": "yes", "TRIAL_GONE": None},
        cwd=tmp_path / "work",
    )
    other.join()
    assert done.timed_out and not done.ok and done.seconds < 120, done
    assert done.run_dir == (tmp_path / "run").absolute() and (done.run_dir / "run.json").exists()
    assert json.loads(seen.read_text()) == {"cwd": str(tmp_path / "work"), "asked": "yes", "removed": None}
    assert os.getcwd() == cwd and os.environ["TRIAL_GONE"] == "the caller's" and "TRIAL_ASKED" not in os.environ
    assert {sig: signal.getsignal(sig) for sig in handlers} == handlers
    assert len(second) == 1 and "already running" in str(second[0]) and not (tmp_path / "other").exists()


def test_a_trial_that_ends_in_time_is_not_timed_out(tmp_path):
    (tmp_path / "quick.py").write_text("print('done')\n")
    done = here(str(tmp_path / "quick.py"), run_dir=tmp_path / "run", timeout_s=300)
    assert done.ok and not done.timed_out, done.summary


def test_a_calibration_past_its_timeout_is_refused_with_what_to_change(tmp_path):
    from trainscale.errors import ConfigError
    from trainscale.plan.calibrate import short_run

    (tmp_path / "stuck.py").write_text(STUCK)
    with pytest.raises(ConfigError, match="the calibration run took more than 5 s for 4 steps") as err:
        short_run(
            script=str(tmp_path / "stuck.py"),
            args=(str(tmp_path / "seen.json"),),
            workload=None,
            batch=None,
            steps=3,
            say=lambda line: None,
            timeout_s=5,
        )
    assert "fewer --steps" in err.value.hint and (tmp_path / "seen.json").exists()


def test_a_signal_that_stops_a_trial_reaches_the_caller_after_its_ranks_are_stopped(tmp_path):
    """Ctrl-C during a calibration or a tune trial stops the command, not only that run."""
    (tmp_path / "interrupt.py").write_text(
        "import os, signal, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))"
        "\nos.kill(os.getppid(), signal.SIGINT)\ntime.sleep(600)\n"
    )
    # the caller's own disposition of SIGINT is what the signal meets again: Python's, as in a terminal (a pytest-xdist
    # worker ignores SIGINT)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            here(str(tmp_path / "interrupt.py"), (str(tmp_path / "pid"),), run_dir=tmp_path / "run", timeout_s=300)
    finally:
        signal.signal(signal.SIGINT, previous)
    with pytest.raises(ProcessLookupError):  # its rank was stopped first
        os.kill(int((tmp_path / "pid").read_text()), 0)
