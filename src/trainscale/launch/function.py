"""``trainscale.launch(fn, *args, nproc=N)``: run a function on N local ranks, from a notebook or a script.

    def train(lr):
        with trainscale.init() as rt:
            ...
            return rt.rank, final_loss

    results = trainscale.launch(train, 1e-3, nproc=2)      # [(0, ...), (1, ...)], indexed by rank

The ranks are fresh processes started by torch's elastic agent with trainscale's defaults (launch/local.py),
each running the pickled call through launch/runner.py: nothing is forked from the caller (docs/ecosystem.md,
"Notebooks and plain Python").
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from trainscale.launch.local import LocalLaunchSpec
from trainscale.launch.local import launch as run_agent
from trainscale.launch.runner import failure, read_failures, read_results, write_call
from trainscale.launch.torchrun import resolve_nproc

RUNNER = "trainscale.launch.runner"


def launch(
    fn: Callable[..., Any],
    /,
    *args: Any,
    nproc: int | str = 1,
    max_restarts: int = 0,
    log_dir: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    all_ranks: bool = False,
) -> list[Any]:
    """Run ``fn(*args)`` on ``nproc`` ranks of this machine (N, or ``gpu``/``cpu``/``auto`` as torchrun reads
    ``--nproc-per-node``); returns the ranks' return values, indexed by rank. Keyword arguments for ``fn``:
    ``functools.partial``. ``max_restarts``: restarts of all ranks after a failure (torchrun's); ``log_dir``:
    where each rank's output goes (default ``./trainscale-runs``); ``env``: extra variables for the ranks;
    ``all_ranks``: show every rank's output, not rank 0's only."""
    ranks = resolve_nproc(nproc)
    with tempfile.TemporaryDirectory(prefix="trainscale-launch-") as tmp:
        write_call(Path(tmp), fn, args)
        spec = LocalLaunchSpec(
            target=RUNNER,
            module=True,
            args=(tmp,),
            nproc_per_node=ranks,
            max_restarts=max_restarts,
            log_dir=Path(log_dir) if log_dir else None,
            console_all_ranks=all_ranks,
            env=dict(env or {}),
        )
        sys.stdout.flush()
        outcome = run_agent(spec)
        if not outcome.ok:
            raise failure(read_failures(Path(tmp)), outcome.summary, getattr(fn, "__qualname__", repr(fn)))
        return read_results(Path(tmp), ranks)
