"""Run `python -m trainscale ...` as a user would, and wait for something without sleeping blindly."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path


def trainscale(tmp: Path, *argv: str, timeout: float = 300, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI in ``tmp`` with its own job-record directory (``TRAINSCALE_STATE_DIR``)."""
    env = {**os.environ, "TRAINSCALE_STATE_DIR": str(tmp / "state"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "trainscale", *argv], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=tmp)


def wait_for(predicate, timeout: float, what: str) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
