"""`trainscale bench`: scaling studies (`--workload cnn`, `SCRIPT`), and `trainscale bench allreduce`."""

from __future__ import annotations

import argparse
import sys

from trainscale.cli.bench_allreduce import add_slurm_options, run_allreduce, slurm_target

HELP = """usage: trainscale bench [--workload NAME | SCRIPT [ARGS...]] [--configs cpu,1,2,4] [--scaling weak|strong]
                        [--config FILE] [--batch-size B] [--epochs E] [--max-steps S] [--data SRC] [--samples N]
                        [--baseline TOKEN] [--sweep-batch 16,32,64] [--out DIR]
                        [--no-plots] [--verbose] [-- WORKLOAD ARGS...]
                        [--slurm --profile P --time T [--nodes 1,2] [--gpus-per-node G] [--account A]
                         [--partition P] [--reservation R] [--launcher torchrun|srun] [--python PATH] [--poll S]]
       trainscale bench allreduce [--sizes 1KB..16MB] [--nproc N] [--iters K] [--hook none|shm|auto] [--out DIR]
                                  [--slurm --profile P --time T --nodes N [--gpus-per-node G] ...]

Configurations: cpu (1 process on CPU), N (N ranks on this node: GPUs when visible, else CPU ranks).
With --slurm every configuration is one batch job (as `trainscale slurm --submit` makes it): N is N ranks
on one node, NxM is N nodes x M ranks, Nn is N nodes x the profile's GPUs (or --gpus-per-node) per node,
and --nodes 1,2 adds 1n,2n. The study directory must be on a file system the compute nodes see.
Weak scaling (default, seed 004's recipe) keeps --batch-size per rank; strong keeps it as the global batch.
A SCRIPT gets its per-rank batch as {batch} in its arguments and TRAINSCALE_BATCH; its steps are timed by
the recorder every run has (no trainscale import needed), as a workload's are.

Examples:
  trainscale bench --workload cnn --configs 1,2 --epochs 2
  trainscale bench --workload cnn --configs 1,2,4 --scaling strong --batch-size 64 --max-steps 50
  trainscale bench --workload cnn --configs 1 --sweep-batch 16,32,64,128 --epochs 1
  trainscale bench --configs 1,2 train.py --batch-size {batch}
  trainscale bench --config study.toml --epochs 1   (its [bench] table: configs = "1,2", scaling = "strong", ...)
  trainscale bench --slurm --profile local-test --gpus-per-node 2 --time 00:10:00 --configs 1 --nodes 1,2
  trainscale bench allreduce --nproc 2 --sizes 1KB..16MB
  trainscale bench allreduce --nproc 2 --hook shm
  trainscale bench allreduce --slurm --profile lumi --account project_465000000 --time 00:10:00 --nodes 2
"""


def _parser() -> argparse.ArgumentParser:
    from trainscale.config.argparsing import Parser  # noqa: PLC0415 (CLI start-up)

    p = Parser(
        prog="trainscale bench",
        usage=HELP.split("\n\n")[0].removeprefix("usage: "),
        description=HELP.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--config", help="a TOML file whose [bench] table sets these options by field name (as StudySpec)")
    p.add_argument(
        "--workload", help="a built-in workload (`trainscale run --help` lists them); or give SCRIPT [ARGS...]"
    )
    p.add_argument("--configs", help="configurations to run: cpu, N ranks here, NxM / Nn with --slurm (default: 1,2)")
    p.add_argument(
        "--scaling",
        choices=("weak", "strong"),
        help="what --batch-size fixes as the ranks grow (every size trains the same data either way): weak, "
        "the per-rank batch (seed 004's recipe; the global batch grows); strong, the global batch "
        "(split over the ranks) (default: weak)",
    )
    p.add_argument("--batch-size", type=int, help="per-rank (weak) or global (strong) batch (default: 16)")
    p.add_argument("--epochs", type=int, help="epochs of every run (default: 2)")
    p.add_argument("--max-steps", type=int, default=None, help="stop every run after this many optimizer steps")
    p.add_argument("--data", default=None, help="the workload's --data (default: its own)")
    p.add_argument("--samples", type=int, default=None, help="the workload's --samples for synthetic data")
    p.add_argument("--baseline", default=None, help="the configuration speedups are relative to (default: the first)")
    p.add_argument(
        "--sweep-batch", default=None, help="per-rank batches to run every configuration with, e.g. 16,32,64"
    )
    p.add_argument("--out", default=None, help="the study's new directory (default: bench-out/<date-time>)")
    p.add_argument("--no-plots", action="store_true", help="write the results without the PNG plots")
    p.add_argument("--verbose", action="store_true", help="show rank 0's output above the progress table")
    add_slurm_options(p, "node counts to add as Nn configurations, e.g. 1,2 (with --slurm)")
    return p


def build(argv: list[str], environ=None):
    """(StudySpec, namespace) from the command line over --config's [bench] table and TRAINSCALE_BENCH_*; raises
    ConfigError."""
    from trainscale.bench.options import study_spec  # noqa: PLC0415 (CLI start-up)
    from trainscale.cli.split import split_command  # noqa: PLC0415 (CLI start-up)

    split = split_command(_parser(), argv, double_dash="rest")
    ns = _parser().parse_args(split.options)
    spec = study_spec(vars(ns), target=split.target, rest=split.rest, slurm=slurm_target(ns), environ=environ)
    return spec, ns


def run(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] in ("-h", "--help"):
        _parser().print_help()
        return 0
    if argv and argv[0] == "allreduce":
        return run_allreduce(argv[1:])
    spec, ns = build(argv)
    from trainscale.bench.session import run_study  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.rundir import shown  # noqa: PLC0415 (CLI start-up)

    if spec.cpu_ranks:
        print("trainscale bench: no GPU visible: configuration N runs N CPU ranks (gloo)", file=sys.stderr)
    outcome = run_study(spec, make_plots=not ns.no_plots, verbose=ns.verbose)
    print("\n".join(outcome.summary(sweep=bool(spec.sweep_batches))))
    for line in outcome.missing:
        print(f"trainscale bench: {line}; the results are written", file=sys.stderr)
    print(f"next: trainscale report {shown(outcome.out_dir)}   (the page: verdicts, tables, plots)")
    for text in outcome.failures():
        print(text, file=sys.stderr)
    return 0 if outcome.ok else 1


def register(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="scaling study: runtime, speedup, efficiency, breakdown, plots; allreduce",
        add_help=False,
        usage=HELP,
    )
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p.set_defaults(func=run, raw=True)
