"""What each rank of ``trainscale selftest`` runs: ``python -m trainscale.selftest.rank checks|hang``.

``checks`` runs every check of selftest/checks.py (plus the CPU binding) and rank 0 writes the
results as JSON. ``hang`` is a separate launch, expected to fail: the last rank stops inside step 2 and
every other rank records in a file of its own, through ``Runtime.on_collective_timeout`` as a user's
script would, how long until its error named that rank (why every rank: docs/gpu.md, the hang row).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import threading
import time
from pathlib import Path

import torch
from torch import nn

import trainscale
from trainscale.runtime.determinism import CUBLAS_CONFIG, deterministic
from trainscale.runtime.nccl import transport_log
from trainscale.selftest.checks import (
    NEEDS_RANKS,
    SGD,
    Check,
    batch,
    check_allreduce,
    check_breakdown,
    check_devices,
    check_equivalence,
    check_resume,
    check_strategies,
    gather,
    mlp,
)
from trainscale.selftest.run import hang_record
from trainscale.topology import current_affinity, detect_topology, format_cpulist
from trainscale.topology.plan import gpu_order, visible_gpus

HANG_STEP = 2
HOLD = "TRAINSCALE_SELFTEST_HOLD"
"""A test hook, a rank number: that rank, once it has named the hang, waits before it records (as the
last rank to notice would: on NCCL each heartbeat looks at its own tick), so the launcher ends it
first — the order that used to lose the finding when only rank 0 recorded."""


def stop_participating(seconds: float) -> None:
    """The hung rank's wait (its stack, which the error shows, ends here); bounded, so this rank ends by
    itself if its launcher does not end it."""
    threading.Event().wait(seconds)
    os._exit(0)


def check_binding(rt) -> Check:
    """Each rank runs on CPUs close to the GPU it drives (its NUMA node), and no two ranks of a host share CPUs."""
    topology = detect_topology()
    affinity = sorted(current_affinity())
    mine = {
        "rank": rt.rank,
        "host": socket.gethostname(),
        "node": rt.node_rank,
        "cpus": affinity,
        "gpu": None,
        "close": [],
        "numa": sorted({n for n in (topology.numa_of(c) for c in affinity) if n is not None}),
    }
    if rt.device.type == "cuda" and topology.gpus:
        node = [g.index for g in topology.gpus]
        order = gpu_order(visible_gpus(os.environ, node), node, rt.local_rank, rt.local_world_size)
        if rt.local_rank < len(order):
            mine["gpu"] = order[rt.local_rank]
            mine["close"] = sorted(topology.gpu_cores().get(mine["gpu"], ()))
    every = gather(rt, mine)
    problems = []
    for r in every:
        if r["gpu"] is not None and r["close"] and not set(r["cpus"]) <= set(r["close"]):
            problems.append(
                f"rank {r['rank']} runs on CPUs {format_cpulist(r['cpus'])}, GPU {r['gpu']}'s close "
                f"CPUs are {format_cpulist(r['close'])}"
            )
    for i, a in enumerate(every):
        for b in every[i + 1 :]:
            if (a["host"], a["node"]) == (b["host"], b["node"]) and set(a["cpus"]) & set(b["cpus"]):
                problems.append(f"ranks {a['rank']} and {b['rank']} share CPUs")
    gpus = [r for r in every if r["gpu"] is not None]
    if gpus:
        figure = "; ".join(
            f"rank {r['rank']}: GPU {r['gpu']} (NUMA {','.join(map(str, r['numa'])) or '?'}), "
            f"CPUs {format_cpulist(r['cpus'])}"
            for r in gpus[:4]
        ) + (" ..." if len(gpus) > 4 else "")
    else:
        figure = "no GPU: " + "; ".join(f"rank {r['rank']} CPUs {format_cpulist(r['cpus'])}" for r in every[:4])
    status = "warn" if problems else "pass"  # binding is an optimisation: never a failed run
    return Check(
        name="binding", status=status, figure="; ".join(problems[:3]) if problems else figure, detail={"ranks": every}
    )


def run_checks(rt, args, nccl_log: str | None = None) -> list[dict]:
    skip = set(filter(None, args.skip.split(",")))
    done: dict[str, dict] = {}

    def resume() -> Check:  # only this check runs deterministically: others use ops without such kernels
        with deterministic(args.deterministic):
            return check_resume(rt, Path(args.workdir), args.deterministic)

    checks = {
        "devices": lambda: check_devices(rt),
        "all-reduce": lambda: check_allreduce(rt, args.sizes, nccl_log),
        "equivalence": lambda: check_equivalence(rt),
        "strategies": lambda: check_strategies(rt, skip),
        "resume": resume,
        "breakdown": lambda: check_breakdown(rt, done.get("all-reduce")),
        "binding": lambda: check_binding(rt),
    }
    results = []
    for name, run in checks.items():
        if name in skip:
            results.append(Check(name=name, status="skip", figure="skipped (--skip)").to_dict())
            continue
        started = time.perf_counter()
        try:
            found = (
                Check(name=name, status="skip", figure="needs 2 or more ranks")
                if name in NEEDS_RANKS and rt.world_size < 2
                else run()
            )
        except Exception as exc:  # one broken check must not hide the others' results
            found = Check(name=name, status="fail", figure=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}")
        row = found.to_dict()
        row["seconds"] = round(time.perf_counter() - started, 3)
        results.append(row)
        done[name] = row
    return results


def run_hang(rt, args) -> None:
    """The last rank stops inside step 2; every other rank records when and how the hang was named."""
    hung = rt.world_size - 1
    entered: dict[str, float] = {}
    held = os.environ.get(HOLD) == str(rt.rank)

    def record(error: Exception) -> None:
        seconds = time.monotonic() - entered.get("at", time.monotonic())
        if held:
            threading.Event().wait(args.timeout + 120)
        hang_record(Path(args.out), rt.rank).write_text(
            json.dumps(
                {
                    "seconds": seconds,
                    "message": str(error),
                    "hung_rank": hung,
                    "rank": rt.rank,
                    "timeout_s": args.timeout,
                    "backend": rt.backend,
                }
            )
            + "\n"
        )

    rt.on_collective_timeout(record)
    model, opt = rt.setup(mlp(), SGD, strategy="ddp")
    for step in range(HANG_STEP + 2):
        if step == HANG_STEP:
            entered["at"] = time.monotonic()
        with rt.guard(step):
            x, y = batch(step, rt)
            loss = nn.functional.cross_entropy(model(x), y)
            if step == HANG_STEP and rt.rank == hung:
                stop_participating(args.timeout + 120)  # inside the step: the others are in its all-reduce
            rt.backward(loss)
            opt.step()
            opt.zero_grad()
            rt.synchronize()  # like a loss.item(): on a GPU the host waits here for the all-reduce


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainscale.selftest.rank")
    p.add_argument("phase", choices=("checks", "hang"))
    p.add_argument("--out", required=True, help="JSON written by rank 0 (hang: one per rank beside it)")
    p.add_argument("--workdir", default=".", help="scratch space every rank sees (checkpoints)")
    p.add_argument("--device", default="auto")
    p.add_argument("--timeout", type=float, default=60.0, help="collective timeout, seconds")
    p.add_argument("--sizes", default="auto", help="all-reduce sweep")
    p.add_argument("--skip", default="", help="checks to skip, comma-separated")
    p.add_argument(
        "--nondeterministic",
        dest="deterministic",
        action="store_false",
        help="leave deterministic mode off: resume is checked within a tolerance instead of bitwise",
    )
    args = p.parse_args(argv)
    # Deterministic mode matters on GPUs only (CPU runs repeat themselves already), and only the resume
    # check runs in it; cuBLAS reads its workspace setting before its first call.
    gpu = args.device != "cpu" and torch.cuda.is_available()
    args.deterministic = args.deterministic and gpu
    nccl_log = None
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", CUBLAS_CONFIG)
    if gpu and args.phase == "checks":  # how NCCL connects the GPUs, for the all-reduce row
        nccl_log = transport_log(os.environ, Path(args.workdir) / "nccl")
    with trainscale.init(device=args.device, timeout_s=args.timeout) as rt:
        if args.phase == "hang":
            run_hang(rt, args)
            return 0
        results = run_checks(rt, args, nccl_log)
        meta = {
            "world_size": rt.world_size,
            "num_nodes": rt.num_nodes,
            "device": str(rt.device),
            "backend": rt.backend,
            "torch": torch.__version__,
            "deterministic": args.deterministic,
            "hosts": sorted(set(gather(rt, socket.gethostname()))),
        }
        if rt.is_main:
            Path(args.out).write_text(json.dumps({"meta": meta, "checks": results}, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
