"""`trainscale run`: torchrun's command line, launching a script, module or built-in workload."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from pathlib import Path

from trainscale.errors import ConfigError

# Options whose torchrun meaning trainscale takes over through its own spec fields.
_SPEC_FIELDS = (
    "nproc_per_node",
    "nnodes",
    "max_restarts",
    "log_dir",
    "training_script",
    "training_script_args",
    "module",
    "no_python",
    "run_path",
    "workload",
    "all_ranks",
    "rdzv_timeout",
    "hang_timeout",
)


SHAPING = (
    "--nproc-per-node",
    "--nnodes",
    "--max-restarts",
    "--standalone",
    "--rdzv-endpoint",
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--log-dir",
)
"""torchrun's options that shape the launch: after the script, one of them is most likely a misplaced one."""


USAGE = "trainscale run [torchrun's options] [trainscale's options] (SCRIPT | -m MODULE | --workload NAME) [ARGS...]"


def _parser():
    """torchrun's parser with trainscale's options. Its help is short: torchrun's options named in one group
    (torchrun's own help describes them), trainscale's described, then the built-in workloads; a mistake is
    two lines, the error and the fix (config/argparsing.py), not a usage of 22 lines above it."""
    from trainscale.config.argparsing import Parser  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.torchrun import parser as torchrun_parser  # noqa: PLC0415 (CLI start-up)
    from trainscale.workloads.registry import table  # noqa: PLC0415 (CLI start-up)

    parser = torchrun_parser()
    parser.__class__ = Parser  # torch's parser (a new one each call), erring as every trainscale command does
    parser.hint, parser.usage = lambda message: _did_you_mean(parser, message), USAGE
    own = {a for g in parser._action_groups if g.title == "trainscale" for a in g._group_actions}
    torchrun = [a for a in parser._actions if a not in own and a.dest != "help"]
    names = " ".join("/".join(s for s in a.option_strings if "_" not in s) for a in torchrun if a.option_strings)
    parser.add_argument_group(
        "torchrun's options",
        textwrap.fill(
            "every option of the installed torch's torchrun, with its meaning and PET_* variable (`torchrun --help` "
            "describes them; their spellings with _ work too): " + names,
            100,
        ),
    )
    for action in torchrun:
        action.help = argparse.SUPPRESS
    parser.epilog += "\nBuilt-in workloads (--workload NAME):\n" + "\n".join(table()) + "\n"
    return parser


def _did_you_mean(parser, message: str) -> str | None:
    """For an option argparse did not recognise, the closest one of ``trainscale run``."""
    import difflib  # noqa: PLC0415 (CLI start-up)

    from trainscale.config.argparsing import unrecognized  # noqa: PLC0415 (CLI start-up)

    options = [s for a in parser._actions for s in a.option_strings if s.startswith("--")]
    for name in unrecognized(message):
        close = difflib.get_close_matches(name, options, n=1)
        if close:
            return f"did you mean {close[0]}? `trainscale run --help` lists the options"
    return None


def build_spec(argv: list[str], environ=None):
    from trainscale.cli.split import given_dests, misplaced_option, split_command  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.local import LocalLaunchSpec, parse_nnodes  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.torchrun import check_ranks_filter, nproc_fits, resolve_nproc  # noqa: PLC0415 (CLI start-up)
    from trainscale.workloads.registry import launch_preflight  # noqa: PLC0415 (CLI start-up)

    parser = _parser()
    split = split_command(parser, argv, target_options=("--workload",))
    ns = parser.parse_args(split.options + ([split.target] if split.target and not split.target_option else []))
    workload = split.target if split.target_option == "--workload" else None
    target = workload or split.target
    wrong = misplaced_option(parser, split, SHAPING)
    if wrong:
        raise ConfigError(
            f"{wrong} after {target} goes to {target}, which never reads it",
            hint=f"launch options go before the script: trainscale run {wrong} ... {target} [ARGS]",
        )
    if not target:
        raise ConfigError(
            "nothing to run",
            hint="give a script (trainscale run train.py), -m MODULE, or --workload NAME "
            "(trainscale run --nproc-per-node 2 --workload cnn)",
        )
    if workload and (ns.module or ns.no_python):
        raise ConfigError("--workload with -m/--no-python", hint="a workload is run by name: drop -m/--no-python")
    nproc = resolve_nproc(ns.nproc_per_node)
    crowded = nproc_fits(nproc, ns.nproc_per_node)
    if crowded:
        print(f"trainscale: {crowded}", file=sys.stderr, flush=True)
    parse_nnodes(ns.nnodes)
    check_ranks_filter(ns.local_ranks_filter)
    script_args = list(split.rest)
    launch_preflight(workload, script_args, nproc_per_node=nproc, nnodes=ns.nnodes, python=not ns.no_python)
    if workload:
        target, script_args = "trainscale.workloads", [workload, *script_args]
    given = given_dests(parser, split.options, environ)
    torchrun = {dest: getattr(ns, dest) for dest in given if dest not in _SPEC_FIELDS}
    return LocalLaunchSpec(
        target=target,
        args=tuple(script_args),
        module=bool(ns.module or workload),
        no_python=bool(ns.no_python),
        nproc_per_node=nproc,
        nnodes=ns.nnodes,
        max_restarts=ns.max_restarts,
        log_dir=Path(ns.log_dir) if ns.log_dir else None,
        console_all_ranks=ns.all_ranks,
        rdzv_timeout_s=ns.rdzv_timeout,
        hang_timeout_s=ns.hang_timeout,
        torchrun=torchrun,
    )


def spread_over_allocation(argv: list[str], environ=None) -> int | None:
    """Inside an allocation (salloc, a batch script) with --nnodes > 1: one agent per node through
    ``srun --overlap``; None when this run stays on this node."""
    from trainscale.cli.split import given_dests, split_command  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.allocation import plan_spread, run_spread  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.local import parse_nnodes  # noqa: PLC0415 (CLI start-up)

    environ = os.environ if environ is None else environ
    parser = _parser()
    split = split_command(parser, argv, target_options=("--workload",))
    ns = parser.parse_args(split.options)
    target = ([split.target_option] if split.target_option else []) + ([split.target] if split.target else [])
    plan = plan_spread(
        split.options,
        target + split.rest,
        parse_nnodes(ns.nnodes)[1],
        given_dests(parser, split.options, environ),
        environ,
    )
    if plan is None:
        return None
    return run_spread(
        plan, environ["SLURM_JOB_ID"], say=lambda line: print(f"trainscale: {line}", file=sys.stderr, flush=True)
    )


def run(args: argparse.Namespace) -> int:
    from trainscale.launch.local import launch  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.summary import finished_lines, next_line  # noqa: PLC0415 (CLI start-up)

    spread = spread_over_allocation(args.argv)
    if spread is not None:
        return spread
    spec = build_spec(args.argv)
    result = launch(spec)
    if result.signal:  # stopped by Ctrl-C, SIGTERM, SIGHUP: one line, the shell's convention for the status
        print(result.summary, file=sys.stderr, flush=True)
        return 128 + result.signal
    if not result.ok:
        print(f"{result.summary}\n{next_line(result)}", file=sys.stderr, flush=True)
        return result.exit_code
    print(finished_lines(spec.nproc_per_node, spec.max_restarts, result), file=sys.stderr, flush=True)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "run", help="launch a script or workload on N ranks (torchrun's options, trainscale's defaults)", add_help=False
    )
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p.set_defaults(func=run, raw=True)
