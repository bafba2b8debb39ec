"""`trainscale report RUN_DIR|STUDY_DIR|JOBID`: the efficiency report (parsing and printing only)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def run(args: argparse.Namespace) -> int:
    from trainscale.report import gather, render_text, write_report

    gathered = gather(args.target)
    if args.text:
        print(render_text(gathered), end="")
        return 0
    out = Path(args.out) if args.out else gathered.source / "report"
    files = write_report(gathered, out)
    print(render_text(gathered), end="")
    print(f"\nreport: {files['html']}" + (f" (+ {len(files) - 2} plot(s))" if len(files) > 2 else ""), file=sys.stderr)
    return 0


def register(sub) -> None:
    p = sub.add_parser("report", help="how well a run used its hardware: verdict, per-rank times, utilisation, MFU")
    p.add_argument("target", help="a run directory, a bench study directory, or a SLURM job id")
    p.add_argument("--out", help="where report.html and its PNGs go (default: TARGET/report)")
    p.add_argument("--text", action="store_true", help="print the summary only, write nothing")
    p.set_defaults(func=run)
