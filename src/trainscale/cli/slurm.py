"""`trainscale slurm`: render a batch script, lint it, submit it and watch it (parsing and printing only)."""

from __future__ import annotations

import argparse
import os
import sys
import time

from trainscale.errors import ConfigError

SHAPING = (
    "--nodes",
    "--gpus-per-node",
    "--ntasks",
    "--time",
    "--account",
    "--partition",
    "--cpus-per-task",
    "--launcher",
    "--mem",
    "--nproc-per-node",
    "--nproc_per_node",
    "--nnodes",
)
"""Options that shape the job (sbatch's, and torchrun's ranks and nodes, which trainscale slurm spells as sbatch
does): after the script, one of them is most likely a misplaced one."""


def build(argv: list[str], environ=None, *, extend=None, command: str = "slurm"):
    """(spec, profile, namespace, preflight) from the command line, config file and environment.

    ``extend(parser)`` adds a command's own options (``trainscale sweep``) and returns their dests, which
    are not job spec fields."""
    from trainscale.cli.slurm_options import ACTIONS  # noqa: PLC0415 (CLI start-up)
    from trainscale.cli.slurm_options import parser as options_parser  # noqa: PLC0415 (CLI start-up)
    from trainscale.cli.split import misplaced_option, split_command  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.slurm.sources import job_spec, spec_values  # noqa: PLC0415 (CLI start-up)
    from trainscale.workloads.registry import job_preflight  # noqa: PLC0415 (CLI start-up)

    parser = options_parser()
    own = (*ACTIONS, *(extend(parser) if extend else ()))
    split = split_command(parser, argv, target_options=("--workload", "-m"))
    ns = parser.parse_args(split.options)
    cli = spec_values({k: v for k, v in vars(ns).items() if k not in own and v is not None})
    target = {"--workload": "workload", "-m": "module"}.get(split.target_option, "script")
    wrong = misplaced_option(parser, split, SHAPING)
    if wrong:
        instead = {
            "--nproc-per-node": "--gpus-per-node N (ranks per node)",
            "--nproc_per_node": "--gpus-per-node N (ranks per node)",
            "--nnodes": "-N/--nodes N",
        }.get(wrong, wrong)
        raise ConfigError(
            f"{wrong} after {split.target} goes to {split.target}, which never reads it",
            hint=f"trainscale {command}'s options go before the script: trainscale {command} "
            f"{instead} ... {split.target} [ARGS]",
        )
    if split.target:
        cli[target] = split.target
    cli |= {"args": tuple(split.rest), "command_line": ("trainscale", command, *argv)}
    spec, profile = job_spec(cli, config_file=ns.config, environ=environ)
    return spec, profile, ns, job_preflight(spec)


def _say(line: str) -> None:
    print(f"trainscale slurm: {line}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from trainscale.launch.slurm import render  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.slurm.lint import errors  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.slurm.sources import check  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.slurm.submit import ask_test_only, test_only_lines  # noqa: PLC0415 (CLI start-up)

    spec, profile, ns, preflight = build(args.argv, os.environ)
    if ns.watch and spec.chain > 1:
        raise ConfigError(
            "--watch follows one job; a chain is several",
            hint="follow it with `trainscale jobs` (a chain is one line there) and `trainscale jobs JOBID`",
        )
    if [ns.dry_run, ns.submit, ns.test_only].count(True) != 1:
        raise ConfigError(
            "give exactly one of --dry-run (print the script), --test-only (ask the scheduler) or --submit (sbatch it)",
            hint="start with --dry-run to read the script trainscale would submit",
        )
    plan, findings, here = check(spec, profile, preflight=preflight)
    for f in findings:
        _say(str(f))
    if ns.dry_run or ns.test_only:
        text = render(spec, profile, plan)
        # when and where SLURM would start it; another cluster's scheduler cannot say (the note above says so)
        answer, said = ask_test_only(text, required=ns.test_only) if here else ("elsewhere", "")
        for line in test_only_lines(answer, said):  # before the script: a refusal is the news
            print(line, file=sys.stderr, flush=True)
        if ns.dry_run:
            print(text, end="")
        if errors(findings):
            return 2
        # a refusal fails either; an unanswered question fails only --test-only, which asked for the answer
        return 1 if answer == "refuses" or (ns.test_only and answer != "accepts") else 0
    if errors(findings):
        _say(f"{len(errors(findings))} error(s): not submitted")
        return 2
    return submit_and_watch(spec, profile, plan, ns)


def submit_and_watch(spec, profile, plan, ns) -> int:
    from trainscale.launch.slurm import watch  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.slurm.job import submit_job  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.slurm.watch import describe_progress, outcome  # noqa: PLC0415 (CLI start-up)

    record = submit_job(spec, profile, plan)
    chain = f"chain of {spec.chain} jobs from " if spec.chain > 1 else ""
    _say(
        f"submitted {chain}job {record.job_id} ({plan.launcher} mode, world size {plan.world_size}); run directory "
        f"{record.run_dir} (trainscale jobs {record.job_id} [--rank R])"
    )
    if not ns.watch:
        print(record.job_id, flush=True)  # alone on stdout, for scripts
        return 0
    progress = Progress(record.run_dir)
    on_poll = progress.poll
    if spec.heals:  # SLURM keeps a --no-kill job whose batch host is lost: requeue it (launch/slurm/healing.py)
        from trainscale.launch.slurm.healing import BatchHostWatch, allocated  # noqa: PLC0415 (CLI start-up)

        host = BatchHostWatch(
            record.job_id,
            str(record.job_dir),
            nodes=int(allocated(spec)),
            min_nodes=spec.min_nodes or spec.nodes,
            requeue=spec.requeue is not False,
            say=progress.say,
        )
        on_poll = lambda info: (progress.poll(info), host.poll(info))  # noqa: E731
    final = watch(
        record.job_id,
        poll_s=ns.poll,
        timeout_s=ns.watch_timeout,
        on_change=lambda info: progress.say(describe_progress(info)),
        on_poll=on_poll,
    )
    progress.end()
    text, status = outcome(final, record)
    print(text, flush=True)
    _say(
        f"next: trainscale report {record.job_id}   (its page: per-rank step times, where the time went; "
        f"trainscale jobs {record.job_id} for its output)"
    )
    return status


class Progress:
    """``--watch``'s lines: each state change, and while the job runs its training (step, pace, loss, ETA: from
    the ranks' records in its run directory), on a terminal one line rewritten in place, elsewhere a line at
    most every :data:`EVERY_S` seconds when it changed."""

    EVERY_S = 30.0

    def __init__(self, run_dir, stream=None, clock=None) -> None:
        self.run_dir, self.stream, self.clock = run_dir, stream or sys.stderr, clock or time.monotonic
        self.live = self.stream.isatty()
        self.shown, self.at, self.open = None, -self.EVERY_S, False

    def say(self, line: str) -> None:
        self.end()
        print(f"trainscale slurm: {line}", file=self.stream, flush=True)

    def poll(self, info) -> None:
        from trainscale.launch.slurm.watch import training_progress  # noqa: PLC0415 (CLI start-up)

        if info.state != "RUNNING":
            return
        text = training_progress(self.run_dir)
        now = self.clock()
        if text is None or text == self.shown or (not self.live and now - self.at < self.EVERY_S):
            return
        self.shown, self.at = text, now
        if self.live:
            self.stream.write(f"\r\033[Ktrainscale slurm: job {info.job_id}: {text}")
            self.stream.flush()
            self.open = True
        else:
            print(f"trainscale slurm: job {info.job_id}: {text}", file=self.stream, flush=True)

    def end(self) -> None:
        if self.open:
            self.stream.write("\n")
            self.open = False


def register(sub) -> None:
    p = sub.add_parser(
        "slurm", help="render, lint, submit and watch a SLURM batch job (torchrun or srun mode)", add_help=False
    )
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p.set_defaults(func=run, raw=True)
