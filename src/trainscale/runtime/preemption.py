"""Checkpoint-and-requeue on SLURM's warning signal, without doing any work inside the handler.

SLURM sends ``--signal=USR1@SECONDS`` before the time limit or a preemption. The handler only sets
a flag; the training loop asks :meth:`Preemption.requested` at each step boundary, which agrees on
the answer across ranks (one tiny all-reduce), so every rank checkpoints at the same step. Where the job's
end is known (``TRAINSCALE_JOB_END``, which trainscale's batch scripts export) and the loop says how long its
saves take (:attr:`Preemption.save_seconds`), the flag is also set once the time left would no longer hold
one and a half saves and the steps until the ranks next agree: a save longer than SLURM's warning still ends
before the limit. Then
rank 0 requeues the job with ``scontrol requeue`` (array jobs in their ``JOBID_TASK`` form) or, where
``scontrol`` is not reachable (inside a container), leaves a marker for the batch script to do it.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainscale.env import detect

MARKER = "requeue-requested"
"""File left in the job directory (LaunchEnv.job_dir) when the batch step must run `scontrol requeue` itself."""
STOPPED = "stopped"
"""File left in the job directory when this attempt stopped with a checkpoint instead of requeueing
(a chain link, or the requeue cap): the batch script then ends the job accordingly."""
# What the batch script asks (TRAINSCALE_ON_SIGNAL, TRAINSCALE_MAX_REQUEUES, TRAINSCALE_PREEMPT_SIGNALS,
# TRAINSCALE_PREEMPT_CHECK_EVERY) and the job's facts are read by env/ into LaunchEnv.


class Preemption:
    """Installs its handler for the preemption signals when made (``Runtime.handle_preemption``); the
    handlers it replaced come back with :meth:`restore`."""

    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.flag = False
        self.received: str | None = None
        self._calls = 0
        env = getattr(runtime, "env", None) or detect()
        self.check_every = env.preempt_check_every
        self.job_end = env.job_end if env.job_end and env.job_end > time.time() else None  # a past end: not ours
        self.save_seconds: Callable[[], float | None] | None = None
        """How long a save takes (the loop's measured ones); with ``job_end``, the last save is timed from it."""
        self._last_call: float | None = None
        self.signals = [getattr(signal, name) for name in env.preempt_signals]
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.signals}

    def _handle(self, signum, frame) -> None:  # async-signal context: set a flag, nothing else
        self.flag = True
        self.received = signal.Signals(signum).name

    def requested(self) -> bool:
        """True on every rank once any rank has received the signal, or the job's end comes too close for one
        more save (call at every step boundary).

        The ranks compare flags every ``check_every`` calls only (one tiny all-reduce), which keeps
        the step path free of a collective; SLURM's warning comes a minute or more ahead.
        """
        if not self.flag and self._time_is_up():
            self.flag = True
        if not self.runtime.is_distributed:
            return self.flag
        self._calls += 1
        if self._calls % self.check_every:
            return False
        flag = torch.tensor([1.0 if self.flag else 0.0], device=self.runtime.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)

    def _time_is_up(self, now: float | None = None) -> bool:
        """Whether the time left holds no more than 1.5 saves, the steps until the ranks next agree and 5 s."""
        now = time.time() if now is None else now
        step, self._last_call = (now - self._last_call if self._last_call is not None else 0.0), now
        save = self.save_seconds() if self.job_end is not None and self.save_seconds is not None else None
        if not save:
            return False
        left = self.job_end - now
        if left > 1.5 * save + (self.check_every + 1) * step + 5.0:
            return False
        self.received = f"the time limit in {max(0.0, left):.0f} s, a save takes {save:.0f} s"
        return True

    def requeue(self, before: Callable[[str], None] | None = None) -> str:
        """Ask SLURM to run this job again (rank 0 only); returns what was done, for the log.

        A successful ``scontrol requeue`` ends this attempt at once (SLURM stops the job's steps), so
        whatever the log must say is handed to ``before`` first, just ahead of the call."""
        env = detect()  # as the batch script left it now, when the signal is acted on
        job = env.requeue_job
        if not self.runtime.is_main:
            return ""
        if job is None:
            return "not a SLURM job: run the same command again to resume from the checkpoint"
        if env.on_signal == "stop":
            return self._stop("stopped for the next link of the chain", env.job_dir)
        cap, restarts = env.max_requeues, env.requeue_count
        if cap is not None and restarts >= cap:
            return self._stop(
                f"requeue cap reached: requeued {restarts} time(s), --max-requeues {cap}; not requeued", env.job_dir
            )
        scontrol = shutil.which("scontrol")
        if scontrol:
            if before is not None:
                before(f"requeueing SLURM job {job} (scontrol requeue); this attempt ends here")
            done = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, timeout=60)
            if done.returncode == 0:
                return f"requeued SLURM job {job} (scontrol requeue)"
            reason = done.stderr.strip() or f"exit {done.returncode}"
        else:
            reason = "scontrol is not reachable here (container?)"
        if env.job_dir:
            Path(env.job_dir, MARKER).write_text(job + "\n")
            return f"{reason}; left {MARKER} in the job directory for the batch script to requeue {job}"
        print(f"trainscale: cannot requeue {job}: {reason}", file=sys.stderr, flush=True)
        return f"could not requeue {job}: {reason}"

    def _stop(self, why: str, job_dir: str | None) -> str:
        """Leave the marker that tells the batch script this attempt stopped on purpose."""
        if job_dir:
            Path(job_dir, STOPPED).write_text(why + "\n")
        return why

    def requeue_and_log(self, head: str, say: Callable[[str], None]) -> None:
        """Requeue (rank 0) and log ``head`` with what was done: ahead of ``scontrol requeue``, which
        ends the attempt at once, then its outcome if this process is still there to say it."""
        announced = False

        def before(plan: str) -> None:
            nonlocal announced
            announced = True
            say(f"{head}; {plan}")

        what = self.requeue(before=before)
        if not announced:
            say(f"{head}; {what}" if what else head)
        elif what:
            say(what)

    def restore(self) -> None:
        """Put back the handlers this one replaced (not SIG_DFL: a SIGUSR1 would then kill the process)."""
        for sig, previous in self._previous.items():
            signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
        self._previous = {}
