"""`trainscale profiles [NAME | --here]`: the cluster profiles (built-in and yours), one profile's settings and its
CPU-GPU binding plan, or the plan for this machine's detected topology (core lists and SLURM mask_cpu masks)."""

from __future__ import annotations

import argparse

from trainscale.errors import ConfigError

EXAMPLES = """examples:
  trainscale profiles                  # every profile: partitions, node shape, binding, launcher
  trainscale profiles lumi             # its settings and its binding plan for one rank per GPU
  trainscale profiles lumi --ranks 4   # the plan for 4 ranks per node
  trainscale profiles --here           # this machine's topology and a plan for it (--reserved 0,8 keeps cores free)
"""


def _print_plan(plan) -> None:
    print("\n".join(plan.describe()))
    if plan.shared:
        print("WARNING: fewer cores than ranks, so some ranks share cores.")
    print(f"\nsrun (one task per GPU): {plan.cpu_bind_option()}")
    print(f"torchrun (one task per node): export TRAINSCALE_CPU_BIND='{plan.to_env()}'  (each worker binds itself)")


def _profile_plan(name: str, ranks: int | None) -> None:
    from trainscale.profiles import binding_plan, load_profile  # noqa: PLC0415 (CLI start-up)
    from trainscale.topology import detect_topology  # noqa: PLC0415 (CLI start-up)

    profile = load_profile(name)
    ranks = ranks or profile.gpus_per_node or 1
    print()
    if profile.binding == "none":
        print('Binding: "none": trainscale leaves CPU affinity to SLURM and the OS.')
        return
    topology = detect_topology() if profile.binding == "topology" else None
    if topology is not None:
        print('Binding: "topology": planned on each node at run time; shown here for THIS machine.')
        print("\n".join(f"  {line}" for line in topology.describe()))
    plan = binding_plan(profile, ranks, topology)
    print(f"Binding plan for {ranks} local rank(s) per node ({plan.source}):")
    _print_plan(plan)


def _here_plan(ranks: int | None, reserved: str | None) -> None:
    from trainscale.topology import detect_topology, parse_cpulist, plan_binding  # noqa: PLC0415 (CLI start-up)

    topology = detect_topology()
    print("Detected topology (" + "; ".join(topology.sources) + "):")
    print("\n".join(f"  {line}" for line in topology.describe()))
    ranks = ranks or len(topology.gpus) or 1
    plan = plan_binding(topology, ranks, reserved=parse_cpulist(reserved or ""))
    print(f"\nBinding plan for {ranks} local rank(s) ({plan.source}):")
    _print_plan(plan)


def run(args) -> int:
    from trainscale.profiles import user_profile_dir  # noqa: PLC0415 (CLI start-up)
    from trainscale.profiles.listing import settings, table  # noqa: PLC0415 (CLI start-up)

    if args.name and args.here:
        raise ConfigError(
            f"a profile ({args.name}) and --here together",
            hint=f"trainscale profiles {args.name} (its plan) or trainscale profiles --here (this machine's)",
        )
    if args.reserved is not None and not args.here:
        raise ConfigError("--reserved applies to this machine's plan", hint="trainscale profiles --here --reserved 0,8")
    if args.here:
        _here_plan(args.ranks, args.reserved)
        return 0
    if args.name:
        print("\n".join(settings(args.name)))
        _profile_plan(args.name, args.ranks)
        return 0
    if args.ranks is not None:
        raise ConfigError(
            "--ranks plans a binding: name a profile, or --here", hint="trainscale profiles lumi --ranks 4"
        )
    print("\n".join(table()))
    print(
        f"\nUser profiles: {user_profile_dir()}/NAME.toml (it replaces a built-in of the same name; "
        'with extends = "NAME" it changes only the keys it sets: docs/profiles.md).'
    )
    print("One profile and its binding plan: trainscale profiles NAME    This machine's: trainscale profiles --here")
    return 0


def register(sub) -> None:
    p = sub.add_parser(
        "profiles",
        help="cluster profiles (built-in and yours); one's settings and CPU-GPU binding plan",
        description="List the cluster profiles, show one with its CPU-GPU binding plan (core lists "
        "and mask_cpu), or plan the binding for this machine's detected topology.",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", nargs="?", help="show this profile's settings and binding plan")
    p.add_argument("--here", action="store_true", help="this machine's detected topology and a binding plan for it")
    p.add_argument("--ranks", type=int, default=None, help="local ranks per node (default: GPUs per node, or 1)")
    p.add_argument("--reserved", default=None, metavar="CORES", help='with --here: cores never to bind, e.g. "0,8,16"')
    p.set_defaults(func=run)
