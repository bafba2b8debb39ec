"""`trainscale workloads`: list the built-in workloads."""

from __future__ import annotations


def run(args) -> int:
    from trainscale.workloads.registry import WORKLOADS, available

    present = available()
    print(f"{'NAME':<13} {'SEED':<8} DESCRIPTION")
    for name, w in WORKLOADS.items():
        note = "" if name in present else "  (not in this installation)"
        print(f"{name:<13} {w.seed:<8} {w.description}{note}")
    print("\nEvery workload accepts --epochs, --max-steps, --batch-size (per rank), --lr, --strategy, --seed.")
    print("Example: trainscale run --nproc-per-node 2 --workload cnn --epochs 5 --batch-size 16 --lr 0.001")
    return 0


def register(sub) -> None:
    p = sub.add_parser("workloads", help="list the built-in workloads")
    p.set_defaults(func=run)
