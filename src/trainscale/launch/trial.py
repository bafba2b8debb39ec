"""One short run, measured: a script, module or built-in workload on N ranks here (through launch/local.py, in
this process, as ``trainscale run`` launches it) or as one SLURM job (submitted, watched, explained as
``trainscale slurm --submit`` would). What plan's calibration and ``--verify``, tune's trials, a study's runs and
``bench allreduce`` all launch through; each reads what it needs from the run directory it gets back.

Here, the launch borrows this process for its length: the environment and working directory it asks for are set
and put back after, the launcher's signal handlers are put back by launch/local.py, and one launch runs at a time
(the launcher's environment is the process's). A timeout stops the workers, never the caller; a signal that stops
the launcher is raised again once it has stopped the workers, for the caller's own handler (Ctrl-C: KeyboardInterrupt).
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainscale.errors import LaunchError
from trainscale.launch.agent import _workers
from trainscale.launch.local import LocalLaunchSpec, launch
from trainscale.launch.slurm import cancel, explain, watch
from trainscale.launch.slurm.job import submit_job
from trainscale.launch.slurm.watch import describe_progress

WORKLOADS = "trainscale.workloads"
"""The module a built-in workload runs as (``trainscale.workloads NAME ARGS``)."""


@dataclass(frozen=True)
class Trial:
    ok: bool
    summary: str
    """How it ended, in trainscale's words: why it failed; a SLURM job's final state."""
    seconds: float
    """From launch (SLURM: submission, queue wait included) to its end."""
    run_dir: Path | None
    """Where its records, logs and run.json went: what ``trainscale report`` reads."""
    timed_out: bool = False
    job_id: str | None = None


_one = threading.Lock()


def here(
    target: str,
    args: tuple[str, ...] = (),
    *,
    module: bool = False,
    nproc: int = 1,
    run_dir: Path,
    env: Mapping[str, str | None] | None = None,
    cwd: Path | None = None,
    timeout_s: float | None = None,
    quiet: bool = True,
) -> Trial:
    """Run ``target`` (a script; a module with ``module``; :data:`WORKLOADS` with the workload's name first in
    ``args``) on ``nproc`` ranks of this node into ``run_dir``, with ``env`` added to this environment (None:
    removed) in ``cwd``. ``timeout_s``: its workers are killed after that long (the trial comes back timed out).
    ``quiet``: what the launcher and its rank 0 print is kept from the console (the failure's summary says why)."""
    spec = LocalLaunchSpec(
        target=target, args=tuple(args), module=module, nproc_per_node=nproc, run_dir=Path(run_dir).absolute()
    )
    if not _one.acquire(blocking=False):
        raise LaunchError(
            "a trial is already running in this process",
            hint="run trials one after the other: each borrows the process's environment",
        )
    expired = threading.Event()
    try:
        quieted = _quiet() if quiet else contextlib.nullcontext()
        with _environ(env or {}), contextlib.chdir(cwd or os.getcwd()), quieted, _deadline(timeout_s, expired):
            result = launch(spec)
    finally:
        _one.release()
    if result.signal:  # the launcher was stopped (Ctrl-C, SIGTERM): the caller's own handler answers it, as before
        signal.raise_signal(result.signal)
    return Trial(
        result.ok and not expired.is_set(), result.summary, result.seconds, result.run_dir, timed_out=expired.is_set()
    )


def on_slurm(spec, profile, plan, *, poll_s: float, say: Callable[[str], None] | None = None) -> Trial:
    """Submit ``spec`` (a SlurmJobSpec resolved and linted into ``plan`` for ``profile``), watch it to a final
    state every ``poll_s`` seconds, saying each change, and explain it. Interrupted (Ctrl-C): the job is cancelled."""
    say = say or (lambda text: None)
    started = time.monotonic()
    record = submit_job(spec, profile, plan)
    say(f"submitted job {record.job_id} ({record.launcher} mode, world size {record.world_size})")
    try:
        final = watch(record.job_id, poll_s=poll_s, on_change=lambda info: say(describe_progress(info)))
    except KeyboardInterrupt:
        cancel(record.job_id)
        raise
    ok = final.state == "COMPLETED"
    return Trial(
        ok,
        explain(final, record),
        time.monotonic() - started,
        record.job_dir,
        timed_out=final.state == "TIMEOUT",
        job_id=record.job_id,
    )


@contextlib.contextmanager
def _environ(changes: Mapping[str, str | None]) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update({key: value for key, value in changes.items() if value is not None})
    for key in [key for key, value in changes.items() if value is None]:
        os.environ.pop(key, None)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """torch's agent tees rank 0 to the sys.stdout/stderr of the moment it starts the ranks, and logs a failure."""
    agent, sink = logging.getLogger("torch.distributed.elastic"), io.StringIO()
    level = agent.level
    agent.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            yield
    finally:
        agent.setLevel(level)


@contextlib.contextmanager
def _deadline(timeout_s: float | None, expired: threading.Event) -> Iterator[None]:
    """Kill the launch's workers once ``timeout_s`` has passed (and any it starts after), from a thread of its own:
    torch's agent sees them fail and returns, and the caller's signal handlers are never used."""
    if timeout_s is None:
        yield
        return

    done = threading.Event()

    def stop() -> None:
        if done.wait(timeout_s):
            return
        expired.set()
        while not done.is_set():
            for pid in list(_workers):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            done.wait(0.5)

    watcher = threading.Thread(target=stop, name="trainscale-trial-deadline", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()
