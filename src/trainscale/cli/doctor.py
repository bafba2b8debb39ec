"""`trainscale doctor`: print the environment report; with --nproc N, from N ranks started by the local launcher."""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import replace
from pathlib import Path

from trainscale.doctor import render, render_json
from trainscale.doctor.main import add_options, main
from trainscale.errors import ConfigError


def _forwarded(args) -> list[str]:
    return [
        "--timeout",
        str(args.timeout),
        "--size-mib",
        str(args.size_mib),
        *(["--network"] if args.network else []),
        *(["--workers", str(args.workers)] if args.workers is not None else []),
    ]


def _launched(args) -> int:
    from trainscale.doctor.launched import launched_report  # noqa: PLC0415 (CLI start-up)

    report, result = launched_report(args.nproc, _forwarded(args), Path(args.log_dir) if args.log_dir else None)
    if report is None:
        print(result.summary or "trainscale doctor: the ranks wrote no report", file=sys.stderr)
        return 1
    report = replace(
        report,
        command="trainscale doctor "
        + shlex.join(["--nproc", str(args.nproc), *_forwarded(args), *(["--json"] if args.json else [])]),
    )
    sys.stdout.write(render_json(report) if args.json else render(report))
    if not result.ok:
        print(result.summary, file=sys.stderr)
    return 1 if report.counts()["error"] or not result.ok else 0


def run(args) -> int:
    if args.nproc is not None:
        if args.nproc < 1:
            raise ConfigError(f"--nproc {args.nproc}: at least one rank is needed", hint="e.g. --nproc 2")
        return _launched(args)

    return main(_forwarded(args) + (["--json"] if args.json else []))


def register(sub) -> None:
    p = sub.add_parser(
        "doctor",
        help="one paste-able report: versions, devices, launch, binding, threads, network",
        description="Check this environment. Under a launcher, run `python -m trainscale.doctor` "
        "on every rank instead (e.g. `trainscale run --nproc-per-node 2 -m "
        "trainscale.doctor --network`, or `srun python -m trainscale.doctor --network`).",
        epilog="examples:\n"
        "  trainscale doctor                   # this process: versions, devices, binding, threads\n"
        "  trainscale doctor --nproc 2 --network  # 2 local ranks and the collectives between them\n"
        "  trainscale doctor --json > doctor.json  # for a support ticket\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_options(p)
    p.add_argument(
        "--nproc",
        type=int,
        default=None,
        metavar="N",
        help="start N local ranks through trainscale's launcher and report from all of them",
    )
    p.add_argument("--log-dir", default=None, help="keep the ranks' logs here (default: a temporary directory)")
    p.set_defaults(func=run)
