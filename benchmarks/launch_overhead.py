"""`trainscale run` vs plain torchrun (`python -m torch.distributed.run`): time to exit and to the first step,
at several sizes.

    .venv/bin/python benchmarks/launch_overhead.py [--sizes 2,16,64] [--repeats 5]

Both start the same trivial script (benchmarks/first_step.py: init the process group, one all-reduce) on N
local ranks, in pairs (trainscale then torchrun, the order alternating between pairs, so that a change of
load on a shared machine falls on both). Time to exit = from just before the launcher process is started to
its exit (the whole launch: start, rendezvous, the step, teardown); launch-to-first-step = to the moment
rank 0's all-reduce returned. Ratio = trainscale / torchrun, median over the pairs, with the spread of the
pairs' own ratios (goal <= 1.10 at every size). Each run also measures how much of the machine other work
took meanwhile (all CPUs' busy time from /proc/stat minus the benchmark's own children's CPU time): a size
whose runs shared more than 10% of the machine with other work is marked "under load".
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from _common import PYTHON, ROOT, clean_env, load, median, run, verdict

SCRIPT = ROOT / "benchmarks" / "first_step.py"
GOAL = 1.10


OTHERS = []
"""Per run: the share of the machine's CPU time that other work took while it ran."""


def busy_s() -> float:
    """Seconds all CPUs have been busy since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def children_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def first_step(argv: list[str], marker: Path, cwd: Path) -> tuple[float, float]:
    """(launch-to-first-step, time to exit) seconds."""
    busy, ours, start = busy_s(), children_s(), time.time()
    wall, _ = run(argv + [str(SCRIPT), str(marker)], env=clean_env(), cwd=cwd, timeout=900)
    others = (busy_s() - busy) - (children_s() - ours)
    OTHERS.append(max(0.0, others) / (wall * (os.cpu_count() or 1)))
    return float(marker.read_text()) - start, wall


def measure(nproc: int, repeats: int, tmp: Path) -> dict[str, list[float]]:
    ours = [PYTHON, "-m", "trainscale", "run", "--nproc-per-node", str(nproc), "--log-dir", str(tmp / "logs")]
    plain = [PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
    got: dict[str, list[float]] = {"ours_exit": [], "plain_exit": [], "ours_first": [], "plain_first": []}
    for k in range(repeats):
        order = [("ours", ours), ("plain", plain)] if k % 2 == 0 else [("plain", plain), ("ours", ours)]
        for name, argv in order:
            first, wall = first_step(argv, tmp / f"{name}-{nproc}-{k}", tmp)
            got[f"{name}_first"].append(first)
            got[f"{name}_exit"].append(wall)
        print(
            f"  {nproc} ranks, pair {k + 1}: trainscale run {got['ours_exit'][-1]:.2f}s to exit "
            f"({got['ours_first'][-1]:.2f}s to first step), torchrun {got['plain_exit'][-1]:.2f}s "
            f"({got['plain_first'][-1]:.2f}s); other work took {OTHERS[-2]:.0%} and {OTHERS[-1]:.0%} of the "
            f"machine; {load()}",
            flush=True,
        )
    return got


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="2,16,64", help="ranks per run, comma-separated")
    p.add_argument("--repeats", type=int, default=5, help="pairs per size")
    p.add_argument("--nproc", type=int, help="one size (the older spelling of --sizes N)")
    a = p.parse_args()
    sizes = [a.nproc] if a.nproc else [int(s) for s in a.sizes.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="ts-launch-"))
    rows = []
    for n in sizes:
        OTHERS.clear()
        got = measure(n, a.repeats, tmp)
        busy = statistics.median(OTHERS)
        pairs = [o / t for o, t in zip(got["ours_exit"], got["plain_exit"])]
        firsts = [o / t for o, t in zip(got["ours_first"], got["plain_first"])]
        rows.append(
            (
                n,
                median(got["ours_exit"]),
                median(got["plain_exit"]),
                statistics.median(pairs),
                min(pairs),
                max(pairs),
                statistics.median(firsts),
                busy,
            )
        )
    print(
        f"\n| ranks | trainscale run, to exit | torchrun, to exit | ratio (median of {a.repeats} pairs) | "
        "spread of the pairs | to first step, ratio | other work's share of the machine (median) |"
    )
    print("|---|---|---|---|---|---|---|")
    for n, ours, plain, ratio, lo, hi, first, busy in rows:
        print(
            f"| {n} | {ours:.2f} s | {plain:.2f} s | **{ratio:.3f}** | {lo:.3f}-{hi:.3f} | {first:.3f} | "
            f"{busy:.0%}{' (under load)' if busy > 0.10 else ''} |"
        )
    worst = max(r[3] for r in rows)
    print(f"\nworst ratio {worst:.3f}: {verdict(worst, GOAL, higher_is_better=False)}; {load()}")


if __name__ == "__main__":
    main()
