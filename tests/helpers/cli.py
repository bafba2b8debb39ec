"""Run `python -m trainscale ...` as a user would, or its command line in this process, and wait for
something without sleeping blindly."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path


def trainscale(
    tmp: Path, *argv: str, timeout: float = 300, env: dict | None = None
) -> subprocess.CompletedProcess[str]:
    """The CLI in ``tmp`` with its own job-record directory (``TRAINSCALE_STATE_DIR``); ``env``'s None values
    unset a variable. Past ``timeout`` its whole process group is killed (ranks included, which would otherwise
    run on) and the failure shows what it had printed."""
    env = {**os.environ, "TRAINSCALE_STATE_DIR": str(tmp / "state"), **(env or {})}
    env = {k: v for k, v in env.items() if v is not None}
    command = [sys.executable, "-m", "trainscale", *argv]
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(
            f"`trainscale {' '.join(argv)}` ran past {timeout:.0f}s; it printed:\n{out[-3000:]}\n{err[-8000:]}"
        ) from None
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def wait_for(predicate, timeout: float, what: str) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def in_process(
    *argv: str,
    cwd: Path,
    env: dict[str, str] | None = None,
    drop: tuple[str, ...] = ("RANK", "WORLD_SIZE", "MASTER_", "SLURM_"),
) -> subprocess.CompletedProcess[str]:
    """``trainscale ARGV`` run in this process, as the command line runs in a process of its own: in ``cwd``,
    with this environment less the variables starting with ``drop`` and plus ``env``, and what it printed
    as a new interpreter would show it (warnings with Python's default filters, log records of WARNING and
    up as message lines, like logging's last resort). Its exit status and output, as subprocess.run gives
    them. Where the launcher process itself is under test (signals to it, its exit by a signal, its process
    tree, a fresh interpreter's imports), run ``python -m trainscale`` instead: :func:`trainscale`. The
    pytest process forks trainscale's own workers, as the command line's does (tests/conftest.py)."""
    from trainscale.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    for key in [k for k in os.environ if k.startswith(drop)]:
        del os.environ[key]
    os.environ.update(env or {})
    printed = logging.StreamHandler(err)
    printed.setLevel(logging.WARNING)
    root = logging.getLogger()
    try:
        os.chdir(cwd)
        root.addHandler(printed)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.resetwarnings()  # a new interpreter's filters, printed to its stderr
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", category)
            warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
            warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: print(
                warnings.formatwarning(message, category, filename, lineno, line), end="", file=sys.stderr
            )
            try:
                code = main(list(argv))
            except SystemExit as exc:  # argparse's usage errors and --help
                code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    finally:
        root.removeHandler(printed)
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
    return subprocess.CompletedProcess(["trainscale", *argv], code, out.getvalue(), err.getvalue())
