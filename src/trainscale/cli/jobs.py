"""`trainscale jobs`, `trainscale logs JOBID [--rank K]`, `trainscale cancel JOBID` (parsing and printing only)."""

from __future__ import annotations

import argparse
import getpass
import os
import sys


def jobs(args: argparse.Namespace) -> int:
    from trainscale.launch.slurm import squeue
    from trainscale.launch.slurm.chains import queue_table

    user = None if args.all else (os.environ.get("USER") or getpass.getuser())
    found = squeue(user=user)
    if not found:
        print(f"no jobs in the queue{'' if args.all else f' for {user}'}")
        return 0
    print("\n".join(queue_table(found)))
    return 0


def logs(args: argparse.Namespace) -> int:
    from trainscale.launch.slurm import load_record
    from trainscale.launch.slurm.watch import log_lines

    print("\n".join(log_lines(load_record(args.job_id), args.rank, args.tail)))
    return 0


def _job(ref: str) -> str:
    """A job id as given, or the newest job submitted with trainscale for ``last``."""
    from trainscale.launch.slurm.jobdir import LAST, load_record

    return load_record(ref).job_id if ref == LAST else ref


def cancel(args: argparse.Namespace) -> int:
    from trainscale.errors import SlurmError
    from trainscale.launch.slurm import cancel as scancel
    from trainscale.launch.slurm.queue import TERMINAL, job_info

    job = _job(args.job_id)
    info = job_info(job)  # scancel says nothing, and exits 0, for a job it does not know or that has ended
    if info is None:
        raise SlurmError(f"SLURM knows no job {job}: nothing cancelled",
                         hint="`trainscale jobs` lists yours; `trainscale cancel last` the newest you submitted")
    if info.state in TERMINAL:
        print(f"trainscale: job {job} already ended {info.state}: nothing to cancel", file=sys.stderr)
        return 0
    scancel(job, signal=args.signal)
    what = f"sent {args.signal} to" if args.signal else "cancelled"
    print(f"trainscale: {what} job {job}", file=sys.stderr)
    return 0


def attach(args: argparse.Namespace) -> int:
    from trainscale.launch.allocation import attach_command

    command = attach_command(_job(args.job_id), args.node, [c for c in args.command if c != "--"])
    os.execvp(command[0], command)  # the shell or command takes over this terminal
    return 0  # pragma: no cover


def register(sub) -> None:
    p = sub.add_parser("jobs", help="your SLURM jobs and their states (squeue)")
    p.add_argument("--all", action="store_true", help="every user's jobs")
    p.set_defaults(func=jobs)
    p = sub.add_parser("logs", help="a job's batch output (with its first failing rank), or one rank's log")
    p.add_argument("job_id", help="a job id of `trainscale jobs`, or `last`: the newest job submitted with trainscale")
    p.add_argument("--rank", type=int, default=None, help="show this global rank's output")
    p.add_argument("--tail", type=int, default=None, help="only the last N lines")
    p.set_defaults(func=logs)
    p = sub.add_parser("attach", help="a shell (or a command) on a running job's node: srun --jobid J --overlap")
    p.add_argument("job_id", help="a running job's id, or `last`")
    p.add_argument("--node", default=None, help="which of the job's nodes (default: its first)")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS... (default: an interactive shell)")
    p.set_defaults(func=attach)
    p = sub.add_parser("cancel", help="cancel a SLURM job (scancel)")
    p.add_argument("job_id", help="the job's id (an array job's id cancels all its tasks, as scancel does), or `last`")
    p.add_argument("--signal", default=None, help="send this signal instead of cancelling, e.g. USR1")
    p.set_defaults(func=cancel)
