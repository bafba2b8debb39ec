"""`trainscale bench`: scaling studies (`--workload cnn`, `SCRIPT`), and `trainscale bench allreduce`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from trainscale.errors import ConfigError

HELP = """usage: trainscale bench [--workload NAME | SCRIPT [ARGS...]] [--configs cpu,1,2,4] [--scaling weak|strong]
                        [--batch-size B] [--epochs E] [--max-steps S] [--data SRC] [--samples N]
                        [--baseline TOKEN] [--sweep-batch 16,32,64] [--out DIR]
                        [--project-to N] [--interconnect PRESET|measured] [--links-per-node K] [--validate]
                        [--no-plots] [--verbose] [-- WORKLOAD ARGS...]
       trainscale bench allreduce [--sizes 1KB..16MB] [--nproc N] [--iters K] [--out DIR]
       trainscale bench --list-interconnects

Configurations: cpu (1 process on CPU), N (N ranks on this node: GPUs when visible, else CPU ranks).
Weak scaling (default, seed 004's recipe) keeps --batch-size per rank; strong keeps it as the global batch.
A SCRIPT gets its per-rank batch as {batch} in its arguments and TRAINSCALE_BENCH_BATCH, and reports
through trainscale.bench.metrics.EpochRecorder (else the whole launch is timed).

Examples:
  trainscale bench --workload cnn --configs 1,2 --epochs 2
  trainscale bench --workload cnn --configs 1,2,4 --scaling strong --batch-size 64 --max-steps 50
  trainscale bench --workload cnn --configs 1 --sweep-batch 16,32,64,128 --epochs 1
  trainscale bench --workload cnn --configs 1,2 --project-to 1024 --interconnect ib-hdr200 --validate
  trainscale bench --configs 1,2 train.py --batch-size {batch}
  trainscale bench allreduce --nproc 2 --sizes 1KB..16MB
"""

_VALUED = {"--workload", "--configs", "--scaling", "--batch-size", "--epochs", "--max-steps", "--data", "--samples",
           "--baseline", "--sweep-batch", "--out", "--project-to", "--interconnect", "--links-per-node", "--overlap"}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainscale bench", usage=HELP)
    p.add_argument("--workload", default=None)
    p.add_argument("--configs", default="1,2")
    p.add_argument("--scaling", default="weak", choices=("weak", "strong"))
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--data", default=None)
    p.add_argument("--samples", type=int, default=None)
    p.add_argument("--baseline", default=None)
    p.add_argument("--sweep-batch", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--project-to", type=int, default=None)
    p.add_argument("--interconnect", default=None)
    p.add_argument("--links-per-node", type=int, default=None)
    p.add_argument("--overlap", type=float, default=1.0)
    p.add_argument("--validate", action="store_true",
                   help="predict the measured multi-rank runs from the 1-rank run and measured busbw")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--verbose", action="store_true", help="show rank 0's output above the progress table")
    p.add_argument("--list-interconnects", action="store_true")
    return p


def split_argv(argv: list[str]) -> tuple[list[str], str | None, list[str], list[str]]:
    """(bench options, script or None, script args, workload args after ``--``)."""
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return argv[:i], None, [], argv[i + 1:]
        if tok in _VALUED:
            i += 2
            continue
        if tok.startswith("-"):
            i += 1
            continue
        return argv[:i], tok, argv[i + 1:], []
    return argv, None, [], []


def list_interconnects() -> str:
    from trainscale.bench.projection import PRESETS

    lines = [f"{'preset':<14} {'busbw GB/s':>10} {'latency us':>10}  source"]
    for p in PRESETS.values():
        lines.append(f"{p.name:<14} {p.busbw_Bps / 1e9:>10.1f} {p.latency_us:>10.0f}  {p.link_gbit:g} Gb/s x "
                     f"{p.links_per_node} x {p.efficiency:.0%}: {p.source}")
    return "\n".join(lines)


def build(argv: list[str]):
    """(StudySpec, ProjectionRequest | None, namespace) from the command line; raises ConfigError."""
    from trainscale.bench.configs import parse_int_list
    from trainscale.bench.session import ProjectionRequest
    from trainscale.bench.study import StudySpec

    options, script, script_args, workload_args = split_argv(argv)
    ns = _parser().parse_args(options)
    if ns.list_interconnects:
        return None, None, ns
    if script and ns.workload:
        raise ConfigError(f"both --workload {ns.workload} and script {script!r} given", hint="benchmark one of them")
    if script and not Path(script).is_file():
        raise ConfigError(f"script {script!r} does not exist",
                          hint="give the path of a training script, or --workload NAME (see `trainscale workloads`)")
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    spec = StudySpec(
        workload=ns.workload if (ns.workload or script) else "cnn", script=script, script_args=tuple(script_args),
        configs=ns.configs, scaling=ns.scaling, batch_size=ns.batch_size, epochs=ns.epochs, max_steps=ns.max_steps,
        data=ns.data, samples=ns.samples, workload_args=tuple(workload_args), baseline=ns.baseline,
        sweep_batches=parse_int_list(ns.sweep_batch, "--sweep-batch") if ns.sweep_batch else (),
        out_dir=Path(ns.out) if ns.out else None, gpus_visible=gpus)
    projection = None
    if ns.project_to is not None or ns.interconnect is not None:
        projection = ProjectionRequest(project_to=ns.project_to or 1024, interconnect=ns.interconnect or "measured",
                                       links_per_node=ns.links_per_node, overlap=ns.overlap)
    return spec, projection, ns


def run(args: argparse.Namespace) -> int:
    argv = list(args.argv)
    if argv and argv[0] in ("-h", "--help"):
        print(HELP)
        return 0
    if argv and argv[0] == "allreduce":
        return run_allreduce(argv[1:])
    spec, projection, ns = build(argv)
    if ns.list_interconnects:
        print(list_interconnects())
        return 0
    from trainscale.bench.results import markdown_table, sweep_table
    from trainscale.bench.session import run_study

    if spec.gpus_visible == 0 and any(t.strip() not in ("cpu",) for t in spec.configs.split(",")):
        print("trainscale bench: no GPU visible: configuration N runs N CPU ranks (gloo)", file=sys.stderr)
    outcome = run_study(spec, projection=projection, validate=ns.validate, make_plots=not ns.no_plots,
                        verbose=ns.verbose)
    study = outcome.study
    print()
    print(sweep_table(study) if spec.sweep_batches else markdown_table(study))
    print()
    if study.get("validation"):
        v = study["validation"]
        if v["mean_abs_error"] is not None:
            print(f"Model check on this machine: predicted vs measured runtime, mean |error| {v['mean_abs_error']:.0%} "
                  f"over {', '.join(v['runs'])} rank run(s)")
    from trainscale.bench.results import busy_warning

    if busy_warning(study):
        print(f"Warning: {busy_warning(study)}")
    if study.get("projection_error"):
        print(f"No projection: {study['projection_error']}")
    for name, path in outcome.files.items():
        print(f"{name:>10}: {path}")
    for name, path in outcome.plots.items():
        print(f"{name:>10}: {path}")
    failed = [r for r in study["runs"] if r.get("status") != "ok"]
    for r in failed:
        print(f"\n{r['name']} ({r['label']}) failed:\n{r.get('failure', '')}", file=sys.stderr)
    return 1 if failed else 0


def run_allreduce(argv: list[str]) -> int:
    from trainscale.bench.allreduce import DEFAULT_SIZES, parse_sizes, table
    from trainscale.bench.runner import measure_allreduce
    from trainscale.bench.study import choose_out_dir

    p = argparse.ArgumentParser(prog="trainscale bench allreduce")
    p.add_argument("--sizes", default=DEFAULT_SIZES, help="SMALLEST..LARGEST (doubling) or a list, e.g. 1KB..16MB")
    p.add_argument("--nproc", type=int, default=2, help="ranks on this node")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--budget", type=float, default=1.0, help="seconds per size at most")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default=None)
    ns = p.parse_args(argv)
    parse_sizes(ns.sizes)  # errors before any launch
    if ns.nproc < 1:
        raise ConfigError(f"--nproc {ns.nproc}: an all-reduce needs at least one rank", hint="e.g. --nproc 2")
    out_dir = choose_out_dir(Path(ns.out) if ns.out else None, root=Path("bench-out") / "allreduce")
    out_dir.mkdir(parents=True, exist_ok=True)
    result = measure_allreduce(ns.nproc, ns.sizes, out_dir / "allreduce.json", out_dir / "logs", iters=ns.iters,
                               budget_s=ns.budget, device=ns.device)
    if not result or "rows" not in result:
        print((result or {}).get("error", "all-reduce benchmark failed"), file=sys.stderr)
        return 1
    print(table(result))
    print(f"\njson: {out_dir / 'allreduce.json'}")
    return 0


run_raw = run


def register(sub) -> None:
    p = sub.add_parser("bench", help="scaling study: runtime, speedup, efficiency, breakdown, plots; allreduce",
                       add_help=False, usage=HELP)
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p.set_defaults(func=run)
