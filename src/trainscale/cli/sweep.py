"""`trainscale sweep`: a grid of configurations as one SLURM job array (or one after another here), and
`trainscale sweep status DIR`: the gathered results table, best first (parsing and printing only)."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from trainscale.errors import ConfigError

HELP = """usage: trainscale sweep (--grid 'KEY=V1,V2 KEY2=...' | --grid-file F.toml) [--max-parallel K]
                        [trainscale slurm's options] (--submit | --dry-run)
                        (SCRIPT | -m MODULE | --workload NAME) [ARGS...]
       trainscale sweep --local [--nproc-per-node N] (--grid ... | --grid-file F) [--output-dir D] TARGET [ARGS...]
       trainscale sweep status DIR [--metric NAME] [--higher-is-better]

Each configuration is ARGS plus --KEY VALUE for its grid values (a workload's keys as --batch-size), run
in its own directory DIR/task-I/ where it may write metrics.json (workloads do). Examples:
  trainscale sweep --grid 'lr=1e-3,3e-4 batch-size=16,32' --max-parallel 2 --profile lumi -A project_465000000 \\
      -N 1 -t 01:00:00 --submit --workload cnn --epochs 3
  trainscale sweep --local --nproc-per-node 2 --grid 'lr=1e-3,3e-4' --workload cnn --max-steps 50
  trainscale sweep status trainscale-jobs/trainscale-cnn-20261123-140000
"""


def _extend(parser: argparse.ArgumentParser) -> tuple[str, ...]:
    group = parser.add_argument_group("the sweep")
    group.add_argument("--grid", help="KEY=V1,V2 ... (one word per key)")
    group.add_argument("--grid-file", help="a TOML file with a [grid] table of lists")
    group.add_argument("--max-parallel", type=int, help="array tasks running at once (sbatch --array ...%%K)")
    group.add_argument("--local", action="store_true", default=None, help="run here, one configuration after another")
    group.add_argument("--nproc-per-node", type=int, help="with --local: ranks per configuration (default 1)")
    return ("grid", "grid_file", "max_parallel", "local", "nproc_per_node")  # not job spec fields


def sweep_parser() -> argparse.ArgumentParser:
    """trainscale slurm's options, the sweep's own, and the sweep's description: `trainscale sweep --help`."""
    from trainscale.cli.slurm_options import parser  # noqa: PLC0415 (CLI start-up)

    p = parser()
    p.prog, p.usage, p.description = "trainscale sweep", argparse.SUPPRESS, HELP
    _extend(p)
    return p


def _say(line: str) -> None:
    print(f"trainscale sweep: {line}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv[:1] == ["status"]:
        return status(argv[1:])
    if argv[:1] in (["-h"], ["--help"]):
        sweep_parser().print_help()
        return 0

    from trainscale.cli.slurm import build  # noqa: PLC0415 (CLI start-up)
    from trainscale.cli.split import split_command  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.slurm.sweep import grid_of  # noqa: PLC0415 (CLI start-up)

    options = split_command(sweep_parser(), argv, target_options=("--workload", "-m")).options
    local = "--local" in options
    if local and not any(a in ("-t", "--time") or a.startswith("--time=") for a in options):
        argv = ["-t", "UNLIMITED", *argv]  # a local sweep has no time limit
    spec, profile, ns, preflight = build(argv, os.environ, extend=_extend, command="sweep")
    grid = grid_of(ns.grid, ns.grid_file)
    if local:  # one configuration after another on this node, each launched as `trainscale run` launches it
        from trainscale.launch.slurm.sweep import run_here  # noqa: PLC0415 (CLI start-up)

        run_dir, failed = run_here(spec, grid, nproc_per_node=ns.nproc_per_node or 1, say=_say)
        status([str(run_dir)])
        return 1 if failed else 0
    from trainscale.launch.slurm import lint, render, resolve  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.slurm.lint import errors  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.slurm.sweep import array_job, configurations, submit_array  # noqa: PLC0415 (CLI start-up)

    spec = array_job(spec, grid, ns.max_parallel)
    if ns.dry_run == ns.submit:
        raise ConfigError("give exactly one of --dry-run or --submit", hint="start with --dry-run")
    plan = resolve(spec, profile)
    findings = lint(spec, profile, plan, preflight=preflight)
    for f in findings:
        _say(str(f))
    for i, config in enumerate(configurations(grid)):
        _say(f"task {i}: " + " ".join(f"{k}={v}" for k, v in config.items()))
    if ns.dry_run:
        print(render(spec, profile, plan), end="")
        return 2 if errors(findings) else 0
    if errors(findings):
        _say(f"{len(errors(findings))} error(s): not submitted")
        return 2
    sub, run_dir, count = submit_array(spec, profile, plan, grid)
    _say(
        f"submitted array job {sub.job_id} ({count} tasks, --array={spec.array}); run directory {run_dir}; "
        f"results: trainscale sweep status {run_dir}"
    )
    print(run_dir, flush=True)
    return 0


def status(argv: list[str]) -> int:
    from trainscale.config.argparsing import Parser  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.slurm.sweep import status as sweep_status  # noqa: PLC0415 (CLI start-up)

    p = Parser(
        prog="trainscale sweep status",
        description="A sweep's results, best first: a table, CSV and Markdown files and a plot in its directory.",
    )
    p.add_argument("dir", help="the sweep's run directory (printed by trainscale sweep)")
    p.add_argument("--metric", help="rank by this metric (default: test_loss, val_loss, loss or train_loss)")
    p.add_argument("--higher-is-better", action="store_true", help="rank the largest value first (e.g. accuracy)")
    ns = p.parse_args(argv)
    print("\n".join(sweep_status(Path(ns.dir), ns.metric, ns.higher_is_better)))
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "sweep",
        help="a grid of configurations as one SLURM job array (or here), and its results",
        add_help=False,
        usage=HELP,
    )
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p.set_defaults(func=run, raw=True)
