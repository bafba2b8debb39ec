"""`trainscale bench allreduce`, and the --slurm options it shares with `trainscale bench` and `selftest`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_slurm_options(p: argparse.ArgumentParser, nodes_help: str, nodes_type: type = str) -> None:
    """The --slurm options of `trainscale bench`, `bench allreduce` and `selftest`."""
    p.add_argument("--slurm", action="store_true", help="run as SLURM jobs (as `trainscale slurm --submit`)")
    p.add_argument("--profile", default=None, help="the cluster profile of the jobs (`trainscale profiles`)")
    p.add_argument("--nodes", type=nodes_type, default=None, help=nodes_help)
    p.add_argument("--gpus-per-node", type=int, default=None, help="on CPU-only profiles: ranks per node")
    p.add_argument("--time", default=None, help="time limit of each job")
    p.add_argument("--account", help="sbatch -A of the jobs (default: the profile's)")
    p.add_argument("--partition", help="sbatch -p of the jobs (default: the profile's)")
    p.add_argument("--reservation", help="sbatch --reservation of the jobs")
    p.add_argument(
        "--launcher",
        choices=("torchrun", "srun"),
        help="one torchrun per node or one srun task per rank (default: the profile's)",
    )
    p.add_argument("--python", help="the Python the jobs run (default: as `trainscale slurm` chooses it)")
    p.add_argument("--poll", type=float, default=None, help="seconds between queue polls")


def slurm_target(ns: argparse.Namespace):
    """The SlurmTarget of ``--slurm ...``, or None; SLURM options without --slurm are refused."""
    from trainscale.bench.slurm_runs import SLURM_ONLY, target_from_options  # noqa: PLC0415 (CLI start-up)

    return target_from_options(slurm=ns.slurm, nodes=ns.nodes, options={k: getattr(ns, k) for k in SLURM_ONLY})


def run_allreduce(argv: list[str]) -> int:
    from trainscale.bench import allreduce_run  # noqa: PLC0415 (CLI start-up)
    from trainscale.bench.allreduce import DEFAULT_SIZES, HOOKS, parse_sizes, table  # noqa: PLC0415 (CLI start-up)
    from trainscale.config.argparsing import Parser  # noqa: PLC0415 (CLI start-up)

    p = Parser(prog="trainscale bench allreduce")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="SMALLEST..LARGEST (doubling) or a list, e.g. 1KB..16MB")
    p.add_argument("--nproc", type=int, default=None, help="ranks on this node (with --slurm: per node)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations per size at most (default: 20)")
    p.add_argument("--budget", type=float, default=1.0, help="seconds per size at most")
    p.add_argument("--device", default="auto", help="auto (GPUs when visible), cpu or cuda")
    p.add_argument("--out", default=None, help="the results' new directory (default: bench-out/allreduce/<date-time>)")
    p.add_argument(
        "--hook",
        default="none",
        choices=HOOKS,
        help="none: the backend's all-reduce; shm: DDP's shared-memory average (CPU ranks of one node); "
        "auto: as --strategy ddp's default",
    )
    add_slurm_options(p, "nodes of the job (with --slurm), default 1")
    ns = p.parse_args(argv)
    parse_sizes(ns.sizes)  # errors before any launch
    target = slurm_target(ns)
    nproc, nodes = allreduce_run.shape(nproc=ns.nproc, gpus_per_node=ns.gpus_per_node, nodes=ns.nodes, target=target)
    result, out_file = allreduce_run.run(
        target=target,
        nproc=nproc,
        nodes=nodes,
        sizes=ns.sizes,
        out=Path(ns.out) if ns.out else None,
        iters=ns.iters,
        budget_s=ns.budget,
        device=ns.device,
        hook=ns.hook,
        say=lambda text: print(f"trainscale bench: {text}", file=sys.stderr, flush=True),
    )
    if not result or "rows" not in result:
        print((result or {}).get("error", "all-reduce benchmark failed"), file=sys.stderr)
        return 1
    print(table(result))
    print(f"\njson: {out_file}")
    return 0
