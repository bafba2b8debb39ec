"""`trainscale bind`: print the CPU binding plan per local rank, as core lists and SLURM mask_cpu masks."""

from __future__ import annotations


def _print_plan(plan) -> None:
    print("\n".join(plan.describe()))
    if plan.shared:
        print("WARNING: fewer cores than ranks, so some ranks share cores.")
    print(f"\nsrun (one task per GPU): {plan.cpu_bind_option()}")
    print(f"torchrun (one task per node): export TRAINSCALE_CPU_BIND='{plan.to_env()}'  (each worker binds itself)")


def run(args) -> int:
    from trainscale.profiles import binding_plan, load_profile
    from trainscale.topology import detect_topology, parse_cpulist, plan_binding

    if args.profile:
        profile = load_profile(args.profile)
        ranks = args.ranks or profile.gpus_per_node or 1
        if profile.binding == "none":
            print(f"profile {profile.name}: binding = \"none\": trainscale leaves CPU affinity to SLURM and the OS.")
            return 0
        topology = detect_topology() if profile.binding == "topology" else None
        if topology is not None:
            print(f"profile {profile.name}: binding = \"topology\": planned on each node at run time; "
                  f"shown here for THIS machine.")
            print("\n".join(f"  {line}" for line in topology.describe()))
        plan = binding_plan(profile, ranks, topology)
        print(f"Binding plan for {ranks} local rank(s) per node ({plan.source}):")
        _print_plan(plan)
        return 0
    topology = detect_topology()
    print("Detected topology (" + "; ".join(topology.sources) + "):")
    print("\n".join(f"  {line}" for line in topology.describe()))
    ranks = args.ranks or len(topology.gpus) or 1
    plan = plan_binding(topology, ranks, reserved=parse_cpulist(args.reserved or ""))
    print(f"\nBinding plan for {ranks} local rank(s) ({plan.source}):")
    _print_plan(plan)
    return 0


def register(sub) -> None:
    p = sub.add_parser("bind", help="show the CPU-GPU binding plan (core lists and mask_cpu) for a profile or this node")
    p.add_argument("--profile", default=None, help="cluster profile (default: detect this machine's topology)")
    p.add_argument("--ranks", type=int, default=None, help="local ranks per node (default: GPUs per node, or 1)")
    p.add_argument("--reserved", default=None, help='cores never to bind, e.g. "0,8,16" (detected topology only)')
    p.set_defaults(func=run)
