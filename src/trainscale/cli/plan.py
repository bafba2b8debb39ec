"""`trainscale plan`: memory per rank for every strategy and the speedup at 1…N ranks and nodes, from a short
calibration of the script or workload as it is, before an allocation is spent; `--tune` searches the fastest
settings here with short real trials (parsing and printing only)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

USAGE = """trainscale plan [--nproc-per-node N] [--nodes M] [--profile P] [--batch-size B] [--interconnect NAME]
                       [--steps S] [--json] (SCRIPT [ARGS...] | --workload NAME [-- WORKLOAD ARGS...])
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
  trainscale plan --tune --workload cnn --nproc-per-node 2 --budget 300     # short real trials: tuned.toml
"""


def _parser() -> argparse.ArgumentParser:
    from trainscale.config.argparsing import Parser

    p = Parser(prog="trainscale plan", usage=USAGE, description=DESCRIPTION,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", help="a built-in workload (`trainscale run --help` lists them); or give SCRIPT [ARGS]")
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1,
                   help="ranks per node to plan for (GPUs per node on a GPU profile; default: 1)")
    p.add_argument("--nodes", "-N", type=int, default=1, help="nodes to plan up to (default: 1)")
    p.add_argument("--profile", help="the cluster profile whose GPUs, memory and network to plan for (default: here)")
    p.add_argument("--batch-size", type=int, help="per-rank batch to plan for (default: the calibration's); a "
                   "workload is calibrated with it")
    p.add_argument("--interconnect", help="the network between nodes (bench --list-interconnects; default: the "
                   "profile's, else ethernet-25g, said as an assumption)")
    p.add_argument("--steps", type=int, default=5, help="optimizer steps of the calibration (default: 5)")
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    return p


def run(args: argparse.Namespace) -> int:
    from trainscale.cli.split import split_command

    argv = list(args.argv)
    # plan's own --tune: before the script (a file) and before `--`; the script's own --tune is its own
    head = argv[:next((i for i, a in enumerate(argv) if a == "--" or Path(a).is_file()), len(argv))]
    if "--tune" in head:
        from trainscale.cli.tune import run_tune

        at = argv.index("--tune")
        return run_tune(argv[:at] + argv[at + 1:])
    if argv and argv[0] in ("-h", "--help"):
        _parser().print_help()
        return 0
    from trainscale.cli.split import misplaced_option
    from trainscale.errors import ConfigError

    parser = _parser()
    split = split_command(parser, argv, double_dash="rest")  # --workload is an option; its own after `--`
    wrong = misplaced_option(parser, split, ("--nproc-per-node", "--nodes", "--profile", "--interconnect", "--steps"))
    if wrong:
        raise ConfigError(f"{wrong} after {split.target} goes to {split.target}, which never reads it",
                          hint=f"plan's options go before the script: trainscale plan {wrong} ... {split.target} [ARGS]")
    ns = parser.parse_args(split.options)
    return plan(ns, split.target, tuple(split.rest))


def plan(ns: argparse.Namespace, script: str | None, args: tuple[str, ...]) -> int:
    from trainscale.bench import planning
    from trainscale.bench.plan import make_plan, render
    from trainscale.errors import ConfigError
    from trainscale.launch.slurm.spec import usable_cpus

    if bool(ns.workload) == bool(script):  # both, or neither
        raise ConfigError("give one thing to plan: --workload NAME or SCRIPT [ARGS]",
                          hint="trainscale plan --workload gpt --nproc-per-node 8, or trainscale plan train.py")
    if script and not Path(script).is_file():
        raise ConfigError(f"script {script} not found", hint="give the path of your training script")
    for name in ("nproc_per_node", "nodes", "steps"):
        if getattr(ns, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')} {getattr(ns, name)}: at least 1", hint="e.g. 2")
    profile = None
    if ns.profile:
        from trainscale.profiles import load_profile

        profile = load_profile(ns.profile)
    if ns.workload:
        from trainscale.workloads.registry import get_workload

        get_workload(ns.workload)  # an unknown name is refused before the calibration
    network, network_source = planning.network(ns.interconnect, profile)
    cal = planning.calibrate(script=script, args=args, workload=ns.workload, batch=ns.batch_size, steps=ns.steps,
                             say=lambda line: print(f"trainscale plan: {line}", file=sys.stderr, flush=True))
    device_bytes, device_source = planning.room(profile, ns.nproc_per_node)
    made = make_plan(cal, what=f"workload {ns.workload}" if ns.workload else " ".join([script, *args]),
                     ranks_per_node=ns.nproc_per_node, nodes=ns.nodes, batch=ns.batch_size, device_bytes=device_bytes,
                     device_source=device_source, network=network, network_source=network_source,
                     target_gpus=bool(profile is not None and profile.gpus_per_node),
                     shared_cores=_cores() if profile is None and not cal.device.startswith("cuda") else None,
                     cpus_per_rank=max(1, (usable_cpus(profile) if profile is not None else _cores())
                                       // ns.nproc_per_node))
    submit = planning.submit_line(profile=profile, nodes=ns.nodes, ranks_per_node=ns.nproc_per_node,
                                  strategy=made.recommended, workload=ns.workload, script=script, args=args,
                                  batch=ns.batch_size)
    submit = submit if made.recommended else None  # nothing fits: no line that would run out of memory
    if ns.json:
        print(json.dumps(made.as_dict() | {"submit": submit}, indent=2))
    else:
        print("\n".join(render(made, submit)))
    return 0


def _cores() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def register(sub) -> None:
    p = sub.add_parser("plan", help="memory per rank for every strategy and the speedup at 1..N ranks, before you "
                                    "queue; --tune: the fastest settings here", add_help=False)
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p.set_defaults(func=run, raw=True)
