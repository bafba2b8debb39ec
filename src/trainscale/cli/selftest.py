"""`trainscale selftest`: check trainscale on this node's GPUs (or a SLURM job's) and print the table."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from trainscale.cli.bench_allreduce import add_slurm_options
from trainscale.errors import ConfigError

EXAMPLES = """examples:
  trainscale selftest                                   # this node: one rank per GPU (2 CPU ranks without GPUs)
  trainscale selftest --nproc 4 --out selftest-gpu4
  trainscale selftest --slurm --profile lumi --account project_465000000 --nodes 2 --time 00:15:00
  trainscale selftest --skip deepspeed,hang --json
"""

SLURM_ONLY = ("profile", "time", "gpus_per_node", "account", "partition", "reservation", "launcher", "python")


def _target(ns: argparse.Namespace):
    """The SLURM target of ``--slurm ...``, or None; SLURM options without --slurm are refused."""
    from trainscale.bench.slurm_runs import target_from_options  # noqa: PLC0415 (CLI start-up)

    return target_from_options(
        slurm=ns.slurm,
        options={k: getattr(ns, k) for k in SLURM_ONLY},
        poll=ns.poll,
        unused="only apply with --slurm",
        here="check this node",
        example="--slurm --profile lumi --account project_465000000 --nodes 2 --time 00:15:00",
    )


def run(ns: argparse.Namespace) -> int:
    from trainscale.selftest.run import SelftestSpec, render, run_selftest, write_report  # noqa: PLC0415 (CLI start-up)

    if ns.gpus_per_node is not None and ns.nproc is not None:
        raise ConfigError("--nproc and --gpus-per-node both give ranks per node", hint="give one of them")
    spec = SelftestSpec(
        nproc=ns.nproc,
        device=ns.device,
        out_dir=Path(ns.out) if ns.out else None,
        timeout_s=ns.timeout,
        hang_timeout_s=ns.hang_timeout,
        sizes=ns.sizes,
        skip=tuple(s.strip() for s in (ns.skip or "").split(",") if s.strip()),
        deterministic=not ns.nondeterministic,
        slurm=_target(ns),
        nodes=ns.nodes or 1,
    )
    command = "trainscale selftest " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["selftest"] else [])
    report = run_selftest(
        spec, command.strip(), say=lambda text: print(f"trainscale selftest: {text}", file=sys.stderr, flush=True)
    )
    json_path, text_path = write_report(report)
    if ns.json:
        print(json_path.read_text(), end="")
    else:
        print(render(report), end="")
        print(
            f"\nAttach to a support ticket: {json_path} (everything) or {text_path} (this table); "
            f"every rank's log is under {Path(report.out_dir) / 'logs'}"
        )
    return 0 if report.ok else 1


def register(sub) -> None:
    p = sub.add_parser(
        "selftest",
        help="check trainscale on this node's GPUs or a SLURM job: pass/fail with figures",
        description="Run trainscale's own checks where your jobs will run: devices, all-reduce "
        "(bus bandwidth), N ranks vs one process, DDP/ZeRO-1/FSDP/DeepSpeed, resume, step "
        "breakdown, CPU binding, and a hung rank turned into a named error. Without "
        "GPUs the same checks run on CPU ranks over gloo.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--nproc",
        type=int,
        default=None,
        metavar="N",
        help="ranks per node (default: one per visible GPU; 2 CPU ranks without GPUs)",
    )
    p.add_argument(
        "--device",
        default="auto",
        choices=("auto", "cpu", "cuda"),
        help="the ranks' device: auto (one GPU per rank when GPUs are visible, else CPU ranks over gloo)",
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="new directory for the report and logs "
        "(default selftest-out/<timestamp>; with --slurm it must be on a file system the nodes see)",
    )
    p.add_argument("--timeout", type=float, default=120.0, metavar="S", help="collective timeout of the checks")
    p.add_argument(
        "--hang-timeout",
        type=float,
        default=10.0,
        metavar="S",
        help="collective timeout of the hang check (the hung rank must be named within S + 60 s)",
    )
    p.add_argument("--sizes", default="auto", help="all-reduce sweep (auto: 1KB..1GB on GPUs, 1KB..16MB on CPUs)")
    p.add_argument(
        "--skip",
        default=None,
        metavar="NAMES",
        help="checks to leave out, comma-separated (e.g. deepspeed: its first start compiles a minute)",
    )
    p.add_argument(
        "--nondeterministic",
        action="store_true",
        help="check resume within 1e-5 without deterministic mode instead of bitwise with it (GPUs)",
    )
    p.add_argument("--json", action="store_true", help="print the JSON report instead of the table")
    add_slurm_options(p, "nodes of the SLURM jobs (default 1)", nodes_type=int)
    p.set_defaults(func=run)
