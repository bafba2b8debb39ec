"""`trainscale report RUN_DIR|STUDY_DIR|SWEEP_DIR|JOBID`: the page on a run; `--against BASE`: two runs side by
side (parsing and printing only)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainscale.errors import ConfigError


def run(args: argparse.Namespace) -> int:
    from trainscale.report import build, render_text, write_report  # noqa: PLC0415 (CLI start-up)
    from trainscale.report.sources import resolve  # noqa: PLC0415 (CLI start-up)

    if args.max_regression is not None and not args.against:
        raise ConfigError(
            "--max-regression compares with a base run, and no --against was given",
            hint="trainscale report RUN --against BASE_RUN --max-regression 10",
        )
    if args.against:
        from trainscale.report.compare import REGRESSED, compare, regressed, render  # noqa: PLC0415 (CLI start-up)

        made = compare(args.target, args.against)
        print("\n".join(render(made, args.max_regression)))
        return REGRESSED if args.max_regression is not None and regressed(made, args.max_regression) else 0
    if args.text:
        print(render_text(build(args.target, None)), end="")
        return 0
    out = Path(args.out) if args.out else resolve(args.target).path / "report"
    page = build(args.target, out)
    files = write_report(page, out)
    print(render_text(page), end="")
    print(f"\nreport: {files['html']}", file=sys.stderr)
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "report",
        help="what ran and how well it used its hardware: verdict, tables, plots (one page)",
        description="One self-contained HTML page (and its text) on a run directory, a bench study "
        "directory, a sweep directory or a SLURM job submitted with trainscale: what ran, "
        "where, when and with which versions; a verdict; tables; plots.",
        epilog="examples:\n"
        "  trainscale report trainscale-runs/latest      # the newest local run\n"
        "  trainscale report last                        # the newest SLURM job submitted here\n"
        "  trainscale report bench-out/latest --text     # a scaling study, as text only\n"
        "  trainscale report runs/new --against runs/old --max-regression 10   # exit 3 if "
        "its step is over 10% slower\n",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "target",
        help="a run directory (what `trainscale run` names at its end), a `trainscale bench` "
        "study directory, a `trainscale sweep` directory, a SLURM job id, or `last` (the newest "
        "job submitted with trainscale); `<dir>/latest` is each kind's newest",
    )
    p.add_argument("--out", help="where report.html, report.txt and the PNGs go (default: TARGET/report)")
    p.add_argument("--text", action="store_true", help="print the page as text only, write nothing")
    p.add_argument(
        "--against",
        metavar="BASE",
        help="another run directory: each step phase, throughput, peak "
        "memory and MFU side by side with signed changes, and what differs between the runs (prints, "
        "writes nothing)",
    )
    p.add_argument(
        "--max-regression",
        metavar="PCT",
        type=float,
        help="with --against: exit 3 when the step time grew by more than PCT percent",
    )
    p.set_defaults(func=run)
