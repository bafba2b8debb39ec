"""`trainscale jobs [JOB] [--rank R | --cancel | --signal S | --attach]`: one door for SLURM jobs (parsing and
printing only). Without JOB the queue; with JOB its output (the batch output with its first failing rank, or one
rank's log), or an act on it: scancel, a signal, a shell on its node."""

from __future__ import annotations

import argparse
import getpass
import os
import sys

from trainscale.errors import ConfigError, SlurmError

EXAMPLES = """examples:
  trainscale jobs                      # your jobs in the queue (squeue), a chain as one line
  trainscale jobs last                 # the newest job you submitted: its batch output, first failing rank first
  trainscale jobs 123456 --rank 3      # rank 3's output (--tail 50: its last 50 lines)
  trainscale jobs last --cancel        # scancel; --signal USR1 sends a signal instead
  trainscale jobs 123456 --attach      # a shell on its first node (srun --jobid J --overlap);
                                       # -- nvidia-smi runs one command
"""


def queue(args: argparse.Namespace) -> int:
    from trainscale.launch.slurm import squeue  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.slurm.chains import queue_table  # noqa: PLC0415 (CLI start-up)

    user = None if args.all else (os.environ.get("USER") or getpass.getuser())
    found = squeue(user=user)
    if not found:
        print(f"no jobs in the queue{'' if args.all else f' for {user}'}")
        return 0
    print("\n".join(queue_table(found)))
    return 0


def logs(args: argparse.Namespace) -> int:
    from trainscale.launch.slurm import load_record  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.slurm.watch import log_lines  # noqa: PLC0415 (CLI start-up)

    print("\n".join(log_lines(load_record(args.job_id), args.rank, args.tail)))
    return 0


def _job(ref: str) -> str:
    """A job id as given, or the newest job submitted with trainscale for ``last``."""
    from trainscale.launch.slurm.jobdir import LAST, load_record  # noqa: PLC0415 (CLI start-up)

    return load_record(ref).job_id if ref == LAST else ref


def cancel(args: argparse.Namespace) -> int:
    from trainscale.launch.slurm import cancel as scancel  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.slurm.queue import TERMINAL, job_info  # noqa: PLC0415 (CLI start-up)

    job = _job(args.job_id)
    info = job_info(job)  # scancel says nothing, and exits 0, for a job it does not know or that has ended
    if info is None:
        raise SlurmError(
            f"SLURM knows no job {job}: nothing cancelled",
            hint="`trainscale jobs` lists yours; `trainscale jobs last --cancel` the newest you submitted",
        )
    if info.state in TERMINAL:
        print(f"trainscale: job {job} already ended {info.state}: nothing to cancel", file=sys.stderr)
        return 0
    scancel(job, signal=args.signal)
    what = f"sent {args.signal} to" if args.signal else "cancelled"
    print(f"trainscale: {what} job {job}", file=sys.stderr)
    return 0


def attach(args: argparse.Namespace) -> int:
    from trainscale.launch.allocation import attach_command  # noqa: PLC0415 (CLI start-up)

    command = attach_command(_job(args.job_id), args.node, args.command)
    os.execvp(command[0], command)  # the shell or command takes over this terminal
    return 0  # pragma: no cover


def run(raw: argparse.Namespace) -> int:
    head, tail = (
        (raw.argv[: raw.argv.index("--")], raw.argv[raw.argv.index("--") + 1 :]) if "--" in raw.argv else (raw.argv, [])
    )
    args = _PARSER.parse_args(head)  # what follows `--` is --attach's command, options and all
    args.command = tail
    acts = [
        name
        for name, given in (("--cancel", args.cancel), ("--signal", args.signal), ("--attach", args.attach))
        if given
    ]
    if len(acts) > 1:
        raise ConfigError(
            f"{' and '.join(acts)} together: one act on a job at a time",
            hint="--cancel ends it, --signal S only signals it, --attach opens a shell on its node",
        )
    reading = [name for name, given in (("--rank", args.rank is not None), ("--tail", args.tail is not None)) if given]
    if args.job_id is None:
        if acts or reading or args.node or args.command:
            raise ConfigError(
                f"{(acts + reading + ['--node'] * bool(args.node) + ['COMMAND'])[0]} needs a job",
                hint="give its id (or `last`, the newest you submitted): trainscale jobs JOB ...",
            )
        return queue(args)
    if args.all:
        raise ConfigError("--all lists every user's queue; it takes no job", hint="trainscale jobs --all")
    if acts and reading:
        raise ConfigError(f"{reading[0]} reads a job's output; {acts[0]} acts on it", hint="give one of them")
    if (args.node or args.command) and not args.attach:
        raise ConfigError(
            "--node and a command are for --attach", hint="trainscale jobs JOB --attach --node HOST -- CMD"
        )
    if args.attach:
        return attach(args)
    if acts:
        return cancel(args)
    return logs(args)


_PARSER: argparse.ArgumentParser


def register(sub) -> None:
    global _PARSER
    p = _PARSER = sub.add_parser(
        "jobs",
        help="your SLURM jobs (squeue); one job's output, or cancel, signal or attach to it",
        description="Without JOB: your jobs in the queue. With JOB (an id, or `last`: the newest job "
        "submitted with trainscale here): its batch output with the first failing rank, "
        "one rank's output, or an act on it.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("job_id", nargs="?", metavar="JOB", help="a job id of `trainscale jobs`, or `last`")
    p.add_argument("--all", action="store_true", help="every user's jobs (the queue only)")
    p.add_argument("--rank", type=int, default=None, help="show this global rank's output")
    p.add_argument("--tail", type=int, default=None, metavar="N", help="only the last N lines")
    p.add_argument(
        "--cancel",
        action="store_true",
        help="cancel it (scancel; an array job's id cancels all its tasks, as scancel does)",
    )
    p.add_argument("--signal", default=None, metavar="SIG", help="send this signal instead of cancelling, e.g. USR1")
    p.add_argument(
        "--attach",
        action="store_true",
        help="a shell on a running job's node (srun --jobid J --overlap); -- COMMAND runs one command",
    )
    p.add_argument("--node", default=None, help="with --attach: which of the job's nodes (default: its first)")
    p.set_defaults(func=run, raw=True)  # parses its own line: what follows `--` is a command
