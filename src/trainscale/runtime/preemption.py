"""Checkpoint-and-requeue on SLURM's warning signal, without doing any work inside the handler.

SLURM sends ``--signal=USR1@SECONDS`` before the time limit or a preemption. The handler only sets
a flag; the training loop asks :meth:`Preemption.requested` at each step boundary, which agrees on
the answer across ranks (one tiny all-reduce), so every rank checkpoints at the same step. Then
rank 0 requeues the job with ``scontrol requeue`` (array jobs in their ``JOBID_TASK`` form) or, where
``scontrol`` is not reachable (inside a container), leaves a marker for the batch script to do it.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

SIGNALS_VAR = "TRAINSCALE_PREEMPT_SIGNALS"
"""Signals that mean "checkpoint and stop", comma-separated names (default: SIGUSR1)."""
CHECK_VAR = "TRAINSCALE_PREEMPT_CHECK_EVERY"
"""Steps between the ranks' agreement on the flag (default 10)."""
MARKER = "requeue-requested"
"""File left in $TRAINSCALE_JOB_DIR when the batch step must run `scontrol requeue` itself."""


def job_to_requeue(environ: dict[str, str] | None = None) -> str | None:
    environ = os.environ if environ is None else environ
    if environ.get("SLURM_ARRAY_JOB_ID") and environ.get("SLURM_ARRAY_TASK_ID"):
        return f"{environ['SLURM_ARRAY_JOB_ID']}_{environ['SLURM_ARRAY_TASK_ID']}"
    return environ.get("SLURM_JOB_ID")


class Preemption:
    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.flag = False
        self.received: str | None = None
        self._calls = 0
        self.check_every = max(1, int(os.environ.get(CHECK_VAR, "10")))
        names = os.environ.get(SIGNALS_VAR, "SIGUSR1")
        self.signals = [getattr(signal, n.strip().upper() if n.strip().upper().startswith("SIG") else
                                "SIG" + n.strip().upper()) for n in names.split(",") if n.strip()]
        for sig in self.signals:
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame) -> None:  # async-signal context: set a flag, nothing else
        self.flag = True
        self.received = signal.Signals(signum).name

    def requested(self) -> bool:
        """True on every rank once any rank has received the signal (call at every step boundary).

        The ranks compare flags every ``check_every`` calls only (one tiny all-reduce), which keeps
        the step path free of a collective; SLURM's warning comes a minute or more ahead.
        """
        if not self.runtime.is_distributed:
            return self.flag
        self._calls += 1
        if self._calls % self.check_every:
            return False
        flag = torch.tensor([1.0 if self.flag else 0.0], device=self.runtime.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)

    def requeue(self, before: Callable[[str], None] | None = None) -> str:
        """Ask SLURM to run this job again (rank 0 only); returns what was done, for the log.

        A successful ``scontrol requeue`` ends this attempt at once (SLURM stops the job's steps), so
        whatever the log must say is handed to ``before`` first, just ahead of the call."""
        job = job_to_requeue()
        if not self.runtime.is_main:
            return ""
        if job is None:
            return "not a SLURM job: run the same command again to resume from the checkpoint"
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
        job_dir = os.environ.get("TRAINSCALE_JOB_DIR")
        if job_dir:
            Path(job_dir, MARKER).write_text(job + "\n")
            return f"{reason}; left {MARKER} in the job directory for the batch script to requeue {job}"
        print(f"trainscale: cannot requeue {job}: {reason}", file=sys.stderr, flush=True)
        return f"could not requeue {job}: {reason}"

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
        for sig in self.signals:
            signal.signal(sig, signal.SIG_DFL)
