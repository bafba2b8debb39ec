"""torch's LocalElasticAgent as `trainscale run` runs it: each restart announced, a signal answered,
SLURM's warning signals passed on to the workers (:func:`take_signals`).

``elastic_launch`` builds its ``LocalElasticAgent`` itself and offers no hook for either, so for the
length of one launch :func:`watching` puts a subclass in its place (``launcher.api`` looks the class up
when it builds the agent). The subclass only observes torch's own steps: a failed group's root-cause
rank, each restart (one console line), and the signal that stopped the launcher (the console stops
showing the ranks' output first, so a rank's KeyboardInterrupt traceback lands in its log, not there).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from trainscale.launch import summary
from trainscale.launch.bootstrap import LOST_PEER


@dataclass
class Watch:
    """What the agent did during one launch."""

    total_attempts: int
    """1 + --max-restarts."""
    attempts: list[summary.Attempt] = field(default_factory=list)
    """The attempts that failed and were restarted, in order."""
    signal: int | None = None
    """The signal that stopped the launcher (torch's agent stopped the workers), if any."""
    workers: int = 0
    """Workers of the last attempt on this node."""

    def history(self, last: summary.RankFailure | None = None, *, finished: bool = False) -> list[summary.Attempt]:
        """Every attempt: the restarted ones, then the last (failed with ``last``, or finished)."""
        if not self.attempts:
            return []
        return [*self.attempts, summary.Attempt(len(self.attempts) + 1, None if finished else last)]


def resume_note(run_dir: str | None) -> str | None:
    """Where a restarted group resumes, when its ranks save through trainscale's Checkpointer."""
    from trainscale.checkpoint import layout  # noqa: PLC0415 (torch-free module)

    directory = layout.noted_directory(run_dir) if run_dir else None
    if directory is None:
        return None
    found = layout.list_checkpoints(directory)
    if not found:
        return f"from the start (no checkpoint in {directory} yet)"
    return f"resuming from {found[0][1]} (step {found[0][0]})"


# torch's lines that trainscale's own replace (the summary, the restart line, the signal line).
_REPLACED = (
    "Received %s death signal",
    "Sending process %s closing signal",
    "Closing process %s via signal %s",
    "failed (exitcode: %s)",
    "[%s] Worker group %s. %s/%s attempts left",
)


class _Quieter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(_REPLACED)


def release_without_waiting(context) -> None:
    """torch's context for function workers (trainscale's own, forked) lets the ranks that returned go through a
    multiprocessing Event, whose ``set()`` then waits for every waiting rank to answer: one SIGKILLed while it
    waited never answers, and the agent would wait forever (docs/reliability.md). This context's ``set()``
    wakes them and waits for none; a killed rank is then seen as the exit it was."""
    event = getattr(context, "_worker_finished_event", None)
    if event is None:
        return
    cond = event._cond

    def set_() -> None:
        locked = cond.acquire(timeout=5)  # a rank killed within Event.wait's few locked lines keeps the lock
        try:
            event._flag.acquire(False)
            event._flag.release()
            while cond._sleeping_count.acquire(False):
                cond._wait_semaphore.release()
        finally:
            if locked:
                cond.release()

    event.set = set_


def _every_failure(context, group, failures: dict) -> None:
    """torch's context for function workers (trainscale's own, forked) returns the first rank it saw fail;
    its context for processes returns every rank that ended badly, the ranks it stopped included. Add
    the others as that one would, so the summary can order the root cause first either way; not a rank
    that had returned and was waiting for the others (a script's would have exited 0)."""
    processes = getattr(getattr(context, "_pc", None), "processes", None)
    if not processes:
        return
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure  # noqa: PLC0415 (torch-free module)

    returned = getattr(context, "_return_values", {})
    for local_rank, process in enumerate(processes):
        rank = group.workers[local_rank].global_rank
        if rank not in failures and local_rank not in returned and process.exitcode not in (0, None):
            failures[rank] = ProcessFailure(
                local_rank=local_rank,
                pid=process.pid,
                exitcode=process.exitcode,
                error_file=context.error_files[local_rank],
            )


_LOGGERS = ("torch.distributed.elastic.multiprocessing.api", "torch.distributed.elastic.agent.server.api")


@contextlib.contextmanager
def watching(total_attempts: int, say: Callable[[str], None], run_dir: Callable[[], str | None]) -> Iterator[Watch]:
    """For one ``elastic_launch``: torch's agent, announcing restarts through ``say`` and keeping
    the signal that stopped it. ``run_dir()`` names the run's directory (where the ranks note their
    checkpoint directory)."""
    import torch.distributed.launcher.api as launcher_api  # noqa: PLC0415 (torch-free module)
    from torch.distributed.elastic.agent.server.api import WorkerState  # noqa: PLC0415 (torch-free module)
    from torch.distributed.elastic.multiprocessing.api import SignalException  # noqa: PLC0415 (torch-free module)

    base = launcher_api.LocalElasticAgent
    watch = Watch(total_attempts)
    pending: list[summary.RankFailure] = []

    class Agent(base):  # type: ignore[misc, valid-type]
        def _start_workers(self, worker_group):
            pids = super()._start_workers(worker_group)
            _workers[:] = pids.values()  # where _forward sends SLURM's warning signals
            release_without_waiting(self._pcontext)
            return pids

        def _monitor_workers(self, worker_group):
            result = super()._monitor_workers(worker_group)
            watch.workers = len(worker_group.workers)
            if result.is_failed():
                _every_failure(self._pcontext, worker_group, result.failures)
                logs = {int(k): Path(v) for k, v in (getattr(self._pcontext, "stderrs", None) or {}).items()}
                # torch's context has stopped the other ranks before returning: every rank's failure is here
                # (summary orders the root cause first: a rank's own recorded error before peers that lost it)
                failures = summary.from_child_failed(result, logs)
                pending[:] = failures[:1]
            return result

        def _restart_workers(self, worker_group):
            if worker_group.state in (WorkerState.FAILED, WorkerState.UNHEALTHY) and pending:
                number = len(watch.attempts) + 1
                watch.attempts.append(summary.Attempt(number, pending[0]))
                say(summary.restart_line(number, pending[0], total_attempts, resume_note(run_dir())))
                pending.clear()
            elif worker_group.state == WorkerState.HEALTHY:  # torch does not count these as restarts
                say("trainscale: a node joined or left the rendezvous; restarting this node's ranks")
            super()._restart_workers(worker_group)

        def _invoke_run(self, *args, **kwargs):
            try:
                return super()._invoke_run(*args, **kwargs)
            except SignalException as exc:
                watch.signal = int(exc.sigval)
                for tail in getattr(self._pcontext, "_tail_logs", ()):  # before torch signals the ranks
                    tail.stop()
                raise

    import torch.distributed.elastic.multiprocessing.api as processes  # noqa: PLC0415 (torch-free module)

    tail_log = processes.TailLog

    class ConsoleTail(tail_log):  # type: ignore[misc, valid-type]
        """The console's copy of the ranks' output, without what a rank that only lost a peer says from its
        LOST_PEER line on (its log keeps it; the summary names the rank that ended first)."""

        def __init__(self, *args, **kwargs):
            if "log_line_filter" not in kwargs and len(args) < 6:
                lost = threading.local()  # torch tails each rank's file in a thread of its own

                def shown(line: str) -> bool:
                    lost.seen = getattr(lost, "seen", False) or line.startswith(LOST_PEER)
                    return not lost.seen

                kwargs["log_line_filter"] = shown
            super().__init__(*args, **kwargs)

    quiet = _Quieter()
    loggers = [] if os.environ.get("LOGLEVEL") else [logging.getLogger(name) for name in _LOGGERS]
    for logger in loggers:
        logger.addFilter(quiet)
    launcher_api.LocalElasticAgent, processes.TailLog = Agent, ConsoleTail
    try:
        yield watch
    finally:
        launcher_api.LocalElasticAgent, processes.TailLog = base, tail_log
        _workers.clear()
        for logger in loggers:
            logger.removeFilter(quiet)


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)
"""What torch's agent answers by stopping the workers (``--signals-to-handle``'s default)."""

FORWARDED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
"""SLURM's warning signals (``--signal=USR1@90``): the agent passes them on to its workers, whose
trainscale runtime checkpoints at the next step boundary. (torchrun's agent would die of them.)"""


def take_signals() -> Callable[[], None]:
    """For one launch: FORWARDED_SIGNALS passed on to the workers. Returns what puts every handler
    the launch changed back (torch's agent installs its own for STOP_SIGNALS when it starts workers)."""
    previous = {sig: signal.getsignal(sig) for sig in (*STOP_SIGNALS, *FORWARDED_SIGNALS)}
    try:
        for sig in FORWARDED_SIGNALS:
            signal.signal(sig, _forward)
    except ValueError:  # not the main thread (launched from a library call): leave signals alone
        return lambda: None

    def restore() -> None:
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)

    return restore


_workers: list[int] = []
"""The pids of the workers the agent started last (a script's interpreter, or a worker forked from the
forkserver of trainscale's own modules)."""


def _forward(signum, frame) -> None:
    for pid in _workers:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
