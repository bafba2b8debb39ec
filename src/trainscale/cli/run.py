"""`trainscale run`: launch a script, module or built-in workload on N local ranks (torchrun-compatible)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from trainscale.errors import ConfigError

HELP = """trainscale run [--nproc-per-node N|auto|gpu] [--nnodes N|MIN:MAX] [--node-rank K]
               [--rdzv-endpoint HOST:PORT] [--rdzv-backend c10d|static] [--rdzv-id ID]
               [--rdzv-timeout S] [--max-restarts K] [--log-dir DIR] [--all-ranks]
               (--workload NAME | -m MODULE | SCRIPT) [ARGS...]

Examples:
  trainscale run --nproc-per-node 2 --workload cnn --epochs 5 --batch-size 16 --lr 0.001
  trainscale run --nproc-per-node 4 train.py --my-option 1
  trainscale run --nnodes 2 --nproc-per-node 4 --rdzv-endpoint node1:29400 --rdzv-id job42 -m mypkg.train
"""


def _launcher_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainscale run", usage=HELP, add_help=True)
    p.add_argument("--nproc-per-node", "--nproc_per_node", default="1")
    p.add_argument("--nnodes", default="1")
    p.add_argument("--node-rank", "--node_rank", type=int, default=None)
    p.add_argument("--rdzv-endpoint", "--rdzv_endpoint", default="")
    p.add_argument("--rdzv-backend", "--rdzv_backend", default="c10d")
    p.add_argument("--rdzv-id", "--rdzv_id", default="")
    p.add_argument("--rdzv-timeout", type=int, default=900)
    p.add_argument("--max-restarts", "--max_restarts", type=int, default=0)
    p.add_argument("--log-dir", "--log_dir", default=None)
    p.add_argument("--all-ranks", action="store_true", help="show every rank's output, prefixed")
    p.add_argument("--standalone", action="store_true", help="accepted for torchrun compatibility (the default)")
    p.add_argument("--workload", default=None)
    p.add_argument("-m", "--module", dest="module", default=None)
    return p


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """Launcher options before the target; everything from the target on belongs to the script."""
    flags_with_value = {"--nproc-per-node", "--nproc_per_node", "--nnodes", "--node-rank", "--node_rank",
                        "--rdzv-endpoint", "--rdzv_endpoint", "--rdzv-backend", "--rdzv_backend", "--rdzv-id",
                        "--rdzv_id", "--rdzv-timeout", "--max-restarts", "--max_restarts", "--log-dir", "--log_dir"}
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in ("--workload", "-m", "--module"):
            return argv[:i + 2], argv[i + 2:]
        if tok.startswith("--workload=") or tok.startswith("--module="):
            return argv[:i + 1], argv[i + 1:]
        if tok in flags_with_value:
            i += 2
            continue
        if tok.startswith("-"):
            i += 1
            continue
        return argv[:i + 1], argv[i + 1:]  # the script path
    return argv, []


def build_spec(argv: list[str]):
    from trainscale.launch.local import LocalLaunchSpec, parse_nnodes, resolve_nproc

    launcher_argv, script_args = split_argv(argv)
    parser = _launcher_parser()
    parser.add_argument("script", nargs="?")
    ns = parser.parse_args(launcher_argv)
    chosen = [x for x in (ns.workload, ns.module, ns.script) if x]
    if len(chosen) != 1:
        raise ConfigError("give exactly one of --workload NAME, -m MODULE or SCRIPT" if chosen else "nothing to run",
                          hint="e.g. trainscale run --nproc-per-node 2 --workload cnn, or trainscale run train.py")
    nproc = resolve_nproc(ns.nproc_per_node)
    module, target = bool(ns.module or ns.workload), ns.module or ns.script
    if ns.workload:
        from trainscale.workloads.registry import get_workload

        workload = get_workload(ns.workload)
        low, high = parse_nnodes(ns.nnodes)
        if low == high:
            preflight = getattr(importlib.import_module(workload.module), "preflight", None)
            if preflight:
                preflight(script_args, nproc * low)
        target, script_args = "trainscale.workloads", [ns.workload, *script_args]
    spec = LocalLaunchSpec(
        target=target, args=tuple(script_args), module=module, nproc_per_node=nproc, nnodes=ns.nnodes,
        node_rank=ns.node_rank, rdzv_endpoint=ns.rdzv_endpoint, rdzv_backend=ns.rdzv_backend, rdzv_id=ns.rdzv_id,
        rdzv_timeout_s=ns.rdzv_timeout, max_restarts=ns.max_restarts,
        log_dir=Path(ns.log_dir) if ns.log_dir else None, console_all_ranks=ns.all_ranks,
    )
    return spec


def run(args: argparse.Namespace) -> int:
    from trainscale.launch.local import launch

    spec = build_spec(args.argv)
    result = launch(spec)
    if not result.ok:
        print(result.summary, file=sys.stderr, flush=True)
        return 1
    print(f"trainscale: {spec.nproc_per_node} rank(s) finished in {result.seconds:.1f}s; per-rank logs in {result.log_dir}",
          file=sys.stderr, flush=True)
    return 0


run_raw = run


def register(sub) -> None:
    p = sub.add_parser("run", help="launch a script or workload on N local ranks (torchrun-compatible)",
                       add_help=False, usage=HELP)
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p.set_defaults(func=run)
