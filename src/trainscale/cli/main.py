"""`trainscale` entry point: builds the parser from one module per subcommand."""

from __future__ import annotations

import argparse
import importlib
import sys

from trainscale._version import __version__
from trainscale.errors import TrainscaleError
from trainscale.launch import bootstrap

# Each module defines `register(subparsers)`, which adds its parser and sets `func`; a command that parses
# the rest of its line itself (it passes options on to a script: `run`, `bench SCRIPT`) also sets `raw`.
SUBCOMMANDS = ("run", "slurm", "sweep", "jobs", "profiles", "bench", "plan", "report", "doctor", "selftest")


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser with every subcommand, or with just ``only`` (a known subcommand's name): a command
    imports its own module and not the others' (``trainscale run`` starts sooner)."""
    from trainscale.config.argparsing import Parser  # noqa: PLC0415 (CLI start-up)

    parser = Parser(
        prog="trainscale",
        description="Run one PyTorch training script on 1 CPU process, N GPUs or many SLURM nodes.",
    )
    parser.add_argument("--version", action="version", version=f"trainscale {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in (only,) if only in SUBCOMMANDS else SUBCOMMANDS:
        importlib.import_module(f"trainscale.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """The command line; without ``argv``, as this process's own command (``trainscale ...``)."""
    if argv is None:
        bootstrap.FORK_OWN_WORKERS = True  # this process is trainscale's: its forkserver can serve the workers
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(argv[0] if argv else None)
    # Commands that pass the rest of the line to a script (`run`, `bench SCRIPT`) parse it themselves:
    # argparse cannot hand options it does not know through a subparser.
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = subparsers.choices.get(argv[0]) if argv else None
    if command is not None and command.get_default("raw"):
        args = argparse.Namespace(argv=argv[1:], func=command.get_default("func"))
    else:
        args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except TrainscaleError as exc:
        print(f"trainscale: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
