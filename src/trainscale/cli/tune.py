"""`trainscale tune`: search per-rank batch, threads, DataLoader workers, DDP buckets and gradient compression
for a workload or script within a time budget; print the best with its gain and write it as a config file."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

USAGE = """trainscale tune [--workload NAME | SCRIPT [ARGS...]] [--nproc-per-node N] [--batch-size B]
                       [--batches 8,16,32] [--budget SECONDS] [--max-steps S] [--strategy S] [--loader L]
                       [--out FILE] [-- WORKLOAD ARGS...]"""
DESCRIPTION = """Each trial is a short real run (--max-steps steps) launched like `trainscale run`; the search changes one
knob at a time from the defaults (per-rank batch, threads per CPU rank, DataLoader workers with
--loader dataloader, DDP bucket size and gradient compression with 2+ DDP ranks) and keeps a value only
when it is faster by more than 3%. The best and the defaults are measured once more at the end; the gain
printed is from that pair. The result is a [train] table (default tuned.toml) that run, slurm and bench
pass to the workload with --config.

Examples:
  trainscale tune --workload cnn --nproc-per-node 2 --budget 300
  trainscale tune --workload cnn --loader dataloader --batches 16,32,64 --budget 600 --out cnn.toml
  trainscale tune train.py --batch-size {batch} --nproc-per-node 2
  trainscale run --nproc-per-node 2 --workload cnn --config tuned.toml
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainscale tune", usage=USAGE, description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default=None, help="a built-in workload to tune (`trainscale workloads`); or give "
                                                    "SCRIPT [ARGS...] with {batch} where the per-rank batch goes")
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1,
                   help="ranks of every trial, as `trainscale run` (default: 1)")
    p.add_argument("--batch-size", type=int, default=16, help="the default per-rank batch to start from (default: 16)")
    p.add_argument("--batches", default=None, help="per-rank batches to try (default: B/2, B, 2B, 4B)")
    p.add_argument("--budget", type=float, default=300.0, help="seconds for the whole search (default: 300)")
    p.add_argument("--max-steps", type=int, default=30, help="optimizer steps per trial (default: 30)")
    p.add_argument("--strategy", default="ddp", help="the workload's --strategy for every trial (default: ddp)")
    p.add_argument("--loader", default="tensor", choices=("tensor", "dataloader"),
                   help="the workload's --loader; dataloader also tries DataLoader workers (default: tensor)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="the workload's --device (default: auto)")
    p.add_argument("--out", default="tuned.toml", help="the [train] config file written (default: tuned.toml)")
    return p


def build(argv: list[str]):
    from trainscale.bench.configs import parse_int_list
    from trainscale.bench.environment import visible_gpus
    from trainscale.bench.tune import TuneSpec
    from trainscale.bench.tuning import check_command
    from trainscale.cli.split import split_command

    split = split_command(_parser(), argv, double_dash="rest")
    ns = _parser().parse_args(split.options)
    script, script_args, workload_args = (split.target, split.rest, []) if split.target else (None, [], split.rest)
    out = Path(ns.out)
    check_command(workload=ns.workload, script=script, out=out)
    device = ("cuda" if visible_gpus() else "cpu") if ns.device == "auto" else ns.device
    spec = TuneSpec(workload=None if script else (ns.workload or "cnn"), script=script, script_args=tuple(script_args),
                    workload_args=tuple(workload_args), nproc_per_node=ns.nproc_per_node, batch_size=ns.batch_size,
                    strategy=ns.strategy, loader=ns.loader, device=device, cores=os.cpu_count() or 1,
                    budget_s=ns.budget, max_steps=ns.max_steps,
                    batches=parse_int_list(ns.batches, "--batches") if ns.batches else ())
    return spec, out


def run(args: argparse.Namespace) -> int:
    from trainscale.bench.tune import knobs
    from trainscale.bench.tuning import report, tune

    argv = list(args.argv)
    if argv and argv[0] in ("-h", "--help"):
        _parser().print_help()
        return 0
    spec, out = build(argv)
    print(f"trainscale tune: {spec.workload or spec.script}, {spec.nproc_per_node} rank(s) on {spec.device}, "
          f"budget {spec.budget_s:.0f}s, {spec.max_steps} steps per trial; knobs: "
          f"{', '.join(k for k, _ in knobs(spec))}", flush=True)
    done = tune(spec, say=lambda line: print(line, flush=True))
    print("\n".join(report(spec, done, out)))
    return 0


def register(sub) -> None:
    p = sub.add_parser("tune", help="search batch, threads, workers, DDP buckets and compression within a budget",
                       add_help=False)
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p.set_defaults(func=run, raw=True)

