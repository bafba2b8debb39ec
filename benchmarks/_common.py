"""Shared helpers for the benchmarks: run a command, time it, alternate A/B runs, print ratios.

Benchmarks, not tests: each prints a ratio measured in the same run. On a shared machine other
processes add noise, so every measurement is repeated with A and B interleaved and the median kept,
and the 1-minute load average is printed next to the result.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable


def clean_env(**extra: str) -> dict[str, str]:
    """The environment for a benchmark child: no leftover launcher variables, fixed threads."""
    drop = (
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "GROUP_RANK",
        "TORCHELASTIC_",
        "TRAINSCALE_",
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run(
    argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 300
) -> tuple[float, str]:
    """(wall seconds, combined output); raises with the output when the command fails."""
    start = time.perf_counter()
    proc = subprocess.run(argv, env=env or clean_env(), cwd=cwd, capture_output=True, text=True, timeout=timeout)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(argv)}\n{proc.stdout}\n{proc.stderr}")
    return took, proc.stdout + proc.stderr


def read_json(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def median(values: list[float]) -> float:
    return statistics.median(values)


def load() -> str:
    try:
        one, five, _ = os.getloadavg()
        return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"
    except OSError:
        return "load average unknown"


def verdict(ratio: float, goal: float, higher_is_better: bool) -> str:
    ok = ratio >= goal if higher_is_better else ratio <= goal
    return f"{'meets' if ok else 'misses'} the goal ({'>=' if higher_is_better else '<='} {goal})"


def recorded(log_dir: Path) -> dict:
    """The timing of the one run under ``log_dir``, from its step records (trainscale's one reader)."""
    from trainscale.observe.reading import run_timing

    (run_dir,) = [d for d in Path(log_dir).iterdir() if (d / "metrics").is_dir() and not d.is_symlink()]
    return run_timing(run_dir)
