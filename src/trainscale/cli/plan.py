"""`trainscale plan`: memory per rank for every strategy and the speedup at 1…N ranks and nodes, from a short
calibration of the script or workload as it is, before an allocation is spent; `--tune` searches the fastest
settings here with short real trials (parsing and printing only)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from trainscale.errors import ConfigError

USAGE = """trainscale plan [--nproc-per-node N] [--nodes M] [--profile P] [--batch-size B] [--mem SIZE]
                       [--interconnect NAME] [--steps S] [--verify] [--json]
                       (SCRIPT [ARGS...] | --workload NAME [-- WORKLOAD ARGS...])
       trainscale plan --tune [--workload NAME | SCRIPT [ARGS...]] [tune options: trainscale plan --tune --help]"""
DESCRIPTION = """One rank runs the script (or workload) unchanged for a few optimizer steps, here, on CPU or one GPU:
trainscale counts its parameters, gradients, optimizer state and the activations its forward keeps, and times its
step's phases. From those: the bytes per rank under ddp, zero1, fsdp and DeepSpeed's stages at N ranks and
whether they fit the profile's GPU (or this machine's memory), and the step time, speedup and efficiency at
1…N ranks and 1…M nodes over the interconnect. Every figure says what it was calibrated on; what the model
cannot see is listed under it.

Examples:
  trainscale plan --workload gpt --nproc-per-node 8 --nodes 4 --profile lumi
  trainscale plan train.py --nproc-per-node 4 --json > plan.json
  trainscale plan --workload cnn --nproc-per-node 2 --verify       # then predicted against measured, here
  trainscale plan --tune --workload cnn --nproc-per-node 2 --budget 300     # short real trials: tuned.toml
"""


def _parser() -> argparse.ArgumentParser:
    from trainscale.config.argparsing import Parser  # noqa: PLC0415 (CLI start-up)

    p = Parser(
        prog="trainscale plan",
        usage=USAGE,
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--workload", help="a built-in workload (`trainscale run --help` lists them); or give SCRIPT [ARGS]")
    p.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        type=int,
        default=1,
        help="ranks per node to plan for (GPUs per node on a GPU profile; default: 1)",
    )
    p.add_argument("--nodes", "-N", type=int, default=1, help="nodes to plan up to (default: 1)")
    p.add_argument("--profile", help="the cluster profile whose GPUs, memory and network to plan for (default: here)")
    p.add_argument(
        "--batch-size",
        type=int,
        help="per-rank batch to plan for (default: the calibration's); a workload is calibrated with it",
    )
    p.add_argument(
        "--mem",
        help="memory per node, as sbatch's --mem (e.g. 64G): the room the ranks of a node "
        "share (default: the profile's GPU or node memory, else this machine's within its cgroup limit)",
    )
    from trainscale.plan.comm import NETWORKS  # noqa: PLC0415 (CLI start-up)

    p.add_argument(
        "--interconnect",
        help=f"the network between nodes: {', '.join(NETWORKS)} (docs/scaling.md; "
        "default: the profile's, else ethernet-25g, said as an assumption)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=10,
        help="optimizer steps of the calibration (default: 10; the first 2 warm up and are left out of its step time)",
    )
    p.add_argument(
        "--verify",
        action="store_true",
        help="then run the cheapest configurations here (2 ranks; a "
        "workload under ddp, zero1 and fsdp) and print predicted against measured",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


def run(args: argparse.Namespace) -> int:
    from trainscale.cli.split import split_command  # noqa: PLC0415 (CLI start-up)

    argv = list(args.argv)
    # plan's own --tune: before the script (a file) and before `--`; the script's own --tune is its own
    head = argv[: next((i for i, a in enumerate(argv) if a == "--" or Path(a).is_file()), len(argv))]
    if "--tune" in head:
        from trainscale.cli.tune import run_tune  # noqa: PLC0415 (CLI start-up)

        at = argv.index("--tune")
        return run_tune(argv[:at] + argv[at + 1 :])
    if argv and argv[0] in ("-h", "--help"):
        _parser().print_help()
        return 0
    from trainscale.cli.split import misplaced_option  # noqa: PLC0415 (CLI start-up)

    parser = _parser()
    split = split_command(parser, argv, double_dash="rest")  # --workload is an option; its own after `--`
    wrong = misplaced_option(
        parser, split, ("--nproc-per-node", "--nodes", "--profile", "--interconnect", "--steps", "--verify", "--mem")
    )
    if wrong:
        raise ConfigError(
            f"{wrong} after {split.target} goes to {split.target}, which never reads it",
            hint=f"plan's options go before the script: trainscale plan {wrong} ... {split.target} [ARGS]",
        )
    ns = parser.parse_args(split.options)
    return plan(ns, split.target, tuple(split.rest))


def plan(ns: argparse.Namespace, script: str | None, args: tuple[str, ...]) -> int:
    from trainscale.plan.calibrate import make  # noqa: PLC0415 (CLI start-up)
    from trainscale.plan.text import render  # noqa: PLC0415 (CLI start-up)

    made, submit = make(
        script=script,
        args=args,
        workload=ns.workload,
        profile_name=ns.profile,
        ranks_per_node=ns.nproc_per_node,
        nodes=ns.nodes,
        batch=ns.batch_size,
        interconnect=ns.interconnect,
        steps=ns.steps,
        check=ns.verify,
        mem=ns.mem,
        say=lambda line: print(f"trainscale plan: {line}", file=sys.stderr, flush=True),
    )
    if ns.json:
        print(json.dumps(made.as_dict() | {"submit": submit}, indent=2))
    else:
        print("\n".join(render(made, submit)))
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "plan",
        help="memory per rank for every strategy and the speedup at 1..N ranks, before you "
        "queue; --tune: the fastest settings here",
        add_help=False,
    )
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p.set_defaults(func=run, raw=True)
