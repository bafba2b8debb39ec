"""All-reduce bandwidth, measured the way nccl-tests reports it, launched exactly like training.

    algbw = bytes / time                      (what one rank's buffer sees)
    busbw = algbw * 2 (n - 1) / n             (the per-link load of a ring all-reduce; comparable
                                               across rank counts and to the hardware's link speed)

``python -m trainscale.bench.allreduce --sizes 1KB..16MB --out F`` is what each rank runs. ``--hook shm``
times DDP's shared-memory average (``ddp:comm_hook=shm``) instead of the backend's all-reduce, and
``auto`` picks it where training's ``comm_hook=auto`` would, so a study's validation measures the path
its runs took. The sweeps, the warm-up before any timing and the plateau: docs/gpu.md, "Timing".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import time
from pathlib import Path

import trainscale
from trainscale.errors import ConfigError

UNITS = {"b": 1, "kb": 1024, "kib": 1024, "mb": 1024**2, "mib": 1024**2, "gb": 1024**3, "gib": 1024**3}
DEFAULT_SIZES = "auto"
CPU_SIZES = "1KB..16MB"
GPU_SIZES = "1KB..1GB"
PLATEAU_GAIN = 1.05
"""The sweep reached the bandwidth plateau when the largest size's busbw is within 5% of the one before
(either way: a larger fall is no plateau but a disturbance, another job on the cores or the link)."""
ELEMENT_BYTES = 4  # float32, as nccl-tests' default
HOOKS = ("none", "shm", "auto")
"""What ``--hook`` times: the backend's all-reduce, DDP's shared-memory average, or what comm_hook=auto picks."""


def parse_size(text: str) -> int:
    """``64KB`` -> 65536 (binary units, as nccl-tests prints them)."""
    match = re.fullmatch(r"\s*(\d+)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if not match or (unit and unit not in UNITS):
        raise ConfigError(f"message size {text!r} not understood", hint="use a number with B, KB, MB or GB, e.g. 4MB")
    size = int(match.group(1)) * UNITS[unit or "b"]
    if size < ELEMENT_BYTES or size % ELEMENT_BYTES:
        raise ConfigError(
            f"message size {text!r} = {size} bytes is not a whole number of float32 elements",
            hint="use a multiple of 4 bytes, e.g. 1KB",
        )
    return size


def sizes_for(text: str, device_type: str) -> tuple[int, ...]:
    """The sweep for a rank on ``device_type``: ``auto`` picks by device, anything else is parsed."""
    if text.strip().lower() == "auto":
        text = GPU_SIZES if device_type == "cuda" else CPU_SIZES
    return parse_sizes(text)


def parse_sizes(text: str) -> tuple[int, ...]:
    """``1KB..16MB`` (doubling, as nccl-tests' -f 2), a list ``1KB,1MB,4MB``, or ``auto`` (checked
    here as the CPU sweep; :func:`sizes_for` picks by device)."""
    if text.strip().lower() == "auto":
        text = CPU_SIZES
    if ".." in text:
        lo_text, _, hi_text = text.partition("..")
        lo, hi = parse_size(lo_text), parse_size(hi_text)
        if hi < lo:
            raise ConfigError(
                f"--sizes {text!r}: the largest size is smaller than the smallest",
                hint="write SMALLEST..LARGEST, e.g. 1KB..16MB",
            )
        sizes, size = [], lo
        while size <= hi:
            sizes.append(size)
            size *= 2
        return tuple(sizes)
    return tuple(parse_size(t) for t in text.split(","))


def format_size(size: float) -> str:
    for unit, scale in (("GB", 1024**3), ("MB", 1024**2), ("KB", 1024)):
        if size >= scale:
            value = size / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{int(size)}B"


def bandwidths(size_bytes: int, seconds: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in bytes per second; busbw is nccl-tests' correction, each rank sends and receives
    2 (n-1)/n of the buffer."""
    if seconds <= 0:
        raise ConfigError(f"all-reduce time {seconds}s", hint="times must be positive")
    algbw = size_bytes / seconds
    return algbw, algbw * 2.0 * (world_size - 1) / world_size


def table(result: dict) -> str:
    """The result as a fixed-width text table (GB/s = 1e9 bytes/s, as nccl-tests)."""
    how = "shared-memory average (comm_hook=shm)" if result.get("hook") == "shm" else "all_reduce (sum, float32)"
    lines = [
        f"{how} on {result['world_size']} rank(s), backend {result['backend']}, device {result['device']}",
        f"{'size':>8} {'count':>10} {'time (us)':>11} {'algbw (GB/s)':>13} {'busbw (GB/s)':>13}",
    ]
    for row in result["rows"]:
        lines.append(
            f"{format_size(row['bytes']):>8} {row['count']:>10} {row['time_s'] * 1e6:>11.1f} "
            f"{row['algbw_Bps'] / 1e9:>13.3f} {row['busbw_Bps'] / 1e9:>13.3f}"
        )
    reached = plateau(result["rows"])
    if reached is not None:
        lines.append(f"peak busbw {reached['busbw_Bps'] / 1e9:.3f} GB/s; " + plateau_words(reached))
    if result.get("disturbed"):
        lines.append(
            f"* disturbed: {result['disturbed']}: these figures are not the link's alone; measure again on a "
            "quiet machine"
        )
    return "\n".join(lines)


def plateau_words(reached: dict) -> str:
    if reached.get("fell"):
        return (
            f"no plateau: the largest size fell {reached['fell']:.0%} below the one before (the cache "
            "outgrown, or other work on the cores or the link: measure again to tell which)"
        )
    if reached["reached"]:
        return "plateau reached at the largest sizes"
    return "still rising at the largest size: sweep larger messages (--sizes ...4GB) for the link's speed"


def disturbance(cores: int | None = None) -> str | None:
    """Other work on this machine as the sweep starts: a load average above its cores (bench/validity.py's rule
    for runs nothing sampled)."""
    cores = cores or os.cpu_count() or 1  # the load average is the whole machine's: against all its cores
    try:
        load = os.getloadavg()[0]
    except OSError:
        return None
    return f"the machine's load average was {load:.1f} on {cores} cores as it started" if load > cores else None


def plateau(rows: list[dict]) -> dict | None:
    """Peak bus bandwidth, and whether the largest two sizes agree within PLATEAU_GAIN (None: too few rows)."""
    timed = [r for r in rows if r.get("busbw_Bps", 0) > 0]
    if len(timed) < 2:
        return None
    last, before = timed[-1]["busbw_Bps"], timed[-2]["busbw_Bps"]
    fell = 1 - last / before if last * PLATEAU_GAIN < before else None
    return {
        "busbw_Bps": max(r["busbw_Bps"] for r in timed),
        "reached": fell is None and last < before * PLATEAU_GAIN,
        "largest_bytes": timed[-1]["bytes"],
        **({"fell": fell} if fell is not None else {}),
    }


def nearest_row(result: dict, size_bytes: int) -> dict:
    """The measured row closest (in log size) to ``size_bytes``."""
    return min(result["rows"], key=lambda r: abs(math.log(r["bytes"]) - math.log(max(1, size_bytes))))


def reducer(rt, hook: str, largest: int):
    """(name, fn): what a timed iteration runs on its buffer — the backend's all-reduce, or the
    shared-memory average for ``shm`` (``auto``: where training's ``comm_hook=auto`` would use it)."""
    import torch.distributed as dist  # noqa: PLC0415 (torch-free module)

    from trainscale.strategies.shm_allreduce import (  # noqa: PLC0415 (torch-free module)
        SharedMemoryAllReduce,
        SharedMemoryUnavailable,
        applies,
        check_device,
    )

    if hook == "auto":
        hook = "shm" if rt.is_distributed and applies(rt.device, rt.backend, rt.world_size) else "none"
    if hook == "shm" and rt.is_distributed:
        check_device(rt.device)
        with contextlib.suppress(SharedMemoryUnavailable):  # several nodes: the backend's, as training's auto
            return "shm", SharedMemoryAllReduce(largest).average
    return "none", dist.all_reduce


def measure(rt, sizes: tuple[int, ...], iters: int, warmup: int, budget_s: float, reduce=None) -> list[dict]:
    """Time ``reduce`` (default: the backend's all-reduce) at each size; a collective."""
    import torch  # noqa: PLC0415 (torch-free module)
    import torch.distributed as dist  # noqa: PLC0415 (torch-free module)

    all_reduce = reduce or dist.all_reduce

    rows = []
    if rt.is_distributed:  # connection set-up for every size (and so every algorithm), untimed
        for size in sizes:
            all_reduce(torch.ones(size // ELEMENT_BYTES, dtype=torch.float32, device=rt.device))
        rt.synchronize()
    for size in sizes:
        count = size // ELEMENT_BYTES
        buf = torch.ones(count, dtype=torch.float32, device=rt.device)
        if not rt.is_distributed:
            rows.append(
                {"bytes": size, "count": count, "iters": 0, "time_s": float("nan"), "algbw_Bps": 0.0, "busbw_Bps": 0.0}
            )
            continue
        for _ in range(max(1, warmup)):
            all_reduce(buf)
        rt.synchronize()
        start = time.perf_counter()
        all_reduce(buf)
        rt.synchronize()
        # Every rank must run the same number of iterations: agree on the slowest rank's estimate.
        one = torch.tensor([time.perf_counter() - start], dtype=torch.float64, device=rt.device)
        dist.all_reduce(one, op=dist.ReduceOp.MAX)
        n_iter = int(max(3, min(iters, budget_s / max(float(one), 1e-9))))
        rt.barrier()
        start = time.perf_counter()
        for _ in range(n_iter):
            all_reduce(buf)
        rt.synchronize()
        took = torch.tensor([(time.perf_counter() - start) / n_iter], dtype=torch.float64, device=rt.device)
        dist.all_reduce(took, op=dist.ReduceOp.MAX)  # a collective is as slow as its slowest rank
        seconds = float(took)
        algbw, busbw = bandwidths(size, seconds, rt.world_size)
        rows.append(
            {"bytes": size, "count": count, "iters": n_iter, "time_s": seconds, "algbw_Bps": algbw, "busbw_Bps": busbw}
        )
    return rows


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="trainscale.bench.allreduce")
    p.add_argument("--sizes", default=DEFAULT_SIZES)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--budget", type=float, default=1.0, help="seconds per size at most (fewer iterations)")
    p.add_argument("--device", default="auto")
    p.add_argument("--out", default=None)
    p.add_argument(
        "--hook", default="none", choices=HOOKS, help="none (the backend's all-reduce), shm, or auto (as training)"
    )
    args = p.parse_args(argv)
    parse_sizes(args.sizes)  # a bad list fails before the process group
    disturbed = disturbance()  # before this sweep's own ranks add to the load
    with trainscale.init(device=args.device) as rt:
        sizes = sizes_for(args.sizes, rt.device.type)
        hook, reduce = reducer(rt, args.hook, max(sizes))
        rows = measure(rt, sizes, args.iters, args.warmup, args.budget, reduce)
        result = {
            "world_size": rt.world_size,
            "num_nodes": rt.num_nodes,
            "backend": rt.backend,
            "device": str(rt.device),
            "hook": hook,
            "rows": rows,
            "plateau": plateau(rows),
            "disturbed": disturbed if rt.device.type == "cpu" else None,
        }  # GPUs' links are not the cores
        if rt.is_main:
            print(table(result), flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
