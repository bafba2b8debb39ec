"""`trainscale plan --tune`: search per-rank batch, threads, DataLoader workers, DDP buckets and gradient compression
for a workload or script within a time budget; print the best with its gain and write it as a config file.
Not a command of its own: `trainscale plan` (cli/plan.py) hands a line with --tune to :func:`run_tune`."""

from __future__ import annotations

import argparse
from pathlib import Path

from trainscale.bench.options import tune_spec
from trainscale.cli.split import split_command
from trainscale.config.argparsing import Parser
from trainscale.plan.tune import DEVICES, LOADERS
from trainscale.plan.tuning import check_command, headline, report, tune

USAGE = """trainscale plan --tune [--workload NAME | SCRIPT [ARGS...]] [--nproc-per-node N] [--batch-size B]
                       [--batches 8,16,32] [--budget SECONDS] [--max-steps S] [--strategy S] [--loader L]
                       [--config FILE] [--out FILE] [-- WORKLOAD ARGS...]"""
DESCRIPTION = """Each trial is a short real run (--max-steps steps) launched like `trainscale run`; the search changes
one knob at a time from the defaults (per-rank batch, threads per CPU rank, DataLoader workers with
--loader dataloader, DDP bucket size and gradient compression with 2+ DDP ranks) and keeps a value only
when it is faster by more than 3%. The best and the defaults are measured once more at the end; the gain
printed is from that pair. The result is a [train] table (default tuned.toml) that run, slurm and bench
pass to the workload with --config.

Examples:
  trainscale plan --tune --workload cnn --nproc-per-node 2 --budget 300
  trainscale plan --tune --workload cnn --loader dataloader --batches 16,32,64 --budget 600 --out cnn.toml
  trainscale plan --tune train.py --batch-size {batch} --nproc-per-node 2
  trainscale run --nproc-per-node 2 --workload cnn --config tuned.toml
"""


def _parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="trainscale plan --tune",
        usage=USAGE,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", help="a TOML file whose [tune] table sets these options by field name (as TuneSpec)")
    p.add_argument(
        "--workload",
        help="a built-in workload to tune (`trainscale run --help` lists them); or give "
        "SCRIPT [ARGS...] with {batch} where the per-rank batch goes",
    )
    p.add_argument(
        "--nproc-per-node", "--nproc_per_node", type=int, help="ranks of every trial, as `trainscale run` (default: 1)"
    )
    p.add_argument("--batch-size", type=int, help="the default per-rank batch to start from (default: 16)")
    p.add_argument("--batches", help="per-rank batches to try (default: B/2, B, 2B, 4B)")
    p.add_argument("--budget", type=float, help="seconds for the whole search (default: 300)")
    p.add_argument("--max-steps", type=int, help="optimizer steps per trial (default: 30)")
    p.add_argument("--strategy", help="the workload's --strategy for every trial (default: ddp)")
    p.add_argument(
        "--loader",
        choices=LOADERS,
        help="the workload's --loader; dataloader also tries DataLoader workers (default: tensor)",
    )
    p.add_argument("--device", choices=DEVICES, help="the workload's --device (default: auto)")
    p.add_argument("--out", default="tuned.toml", help="the [train] config file written (default: tuned.toml)")
    return p


def build(argv: list[str], environ=None):
    """(TuneSpec, the --out file) from the command line over --config's [tune] table and TRAINSCALE_TUNE_*."""
    split = split_command(_parser(), argv, double_dash="rest")
    ns = _parser().parse_args(split.options)
    out = Path(ns.out)
    check_command(workload=ns.workload, script=split.target, out=out)
    return tune_spec(vars(ns), target=split.target, rest=split.rest, environ=environ), out


def run_tune(argv: list[str]) -> int:
    if argv and argv[0] in ("-h", "--help"):
        _parser().print_help()
        return 0
    spec, out = build(argv)
    print(headline(spec), flush=True)
    done = tune(spec, say=lambda line: print(line, flush=True))
    print("\n".join(report(spec, done, out)))
    return 0
