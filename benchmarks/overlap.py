"""Exposed communication share of the cnn's 2-rank DDP step, one bucket (before) vs overlap (after).

    .venv/bin/python benchmarks/overlap.py [--repeats 3] [--epochs 2] [--nproc 2]

Both run `trainscale run --workload cnn` on the same ranks, data and steps, interleaved:
Both use gloo's all-reduce (`comm_hook=none`; the shared-memory `auto` hook blocks backward, so it has
no overlap to measure). *before* is `--strategy ddp:bucket_cap_mb=25,comm_hook=none` (what trainscale passed to DDP
until now: the whole 4.8 MB
gradient in one bucket, so its all-reduce starts after backward), *after* is `--strategy ddp:comm_hook=none`
(`bucket_cap_mb=auto`: several buckets, the first all-reduce starts during backward). Exposed share =
exposed communication / step time, from the runs' step records; the ratio after / before is the result
(lower is better).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import PYTHON, clean_env, load, median, recorded, run

CASES = {
    "before (bucket_cap_mb=25)": "ddp:bucket_cap_mb=25,comm_hook=none",
    "after (bucket_cap_mb=auto)": "ddp:comm_hook=none",
}


def measure(tmp: Path, name: str, spec: str, a: argparse.Namespace) -> dict:
    logs = tmp / "logs" / name
    run(
        [
            PYTHON,
            "-m",
            "trainscale",
            "run",
            "--nproc-per-node",
            str(a.nproc),
            "--log-dir",
            str(logs),
            "--workload",
            "cnn",
            "--epochs",
            str(a.epochs),
            "--batch-size",
            str(a.batch_size),
            "--log-every",
            "0",
            "--strategy",
            spec,
        ],
        env=clean_env(),
        cwd=tmp,
    )
    timing = recorded(logs)
    b = timing["breakdown"]
    return {"step": timing["step_time_s"], "exposed": b["communication"], "share": b["communication_fraction"]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ts-overlap-"))
    seen: dict[str, list[dict]] = {name: [] for name in CASES}
    for k in range(a.repeats):  # interleaved, so drifting load hits both alike
        for i, (name, spec) in enumerate(CASES.items()):
            m = measure(tmp, f"{i}-{k}", spec, a)
            seen[name].append(m)
            print(
                f"repeat {k + 1} {name}: step {m['step'] * 1e3:.1f} ms, communication {m['exposed'] * 1e3:.1f} ms "
                f"exposed = {m['share']:.1%} of the step",
                flush=True,
            )
    print()
    shares = {}
    for name, ms in seen.items():
        shares[name] = median([m["share"] for m in ms])
        exposed = median([m["exposed"] for m in ms])
        print(
            f"{name}: exposed share {shares[name]:.1%} (median of {a.repeats}); communication {exposed * 1e3:.1f} "
            f"ms exposed; step {median([m['step'] for m in ms]) * 1e3:.1f} ms"
        )
    before, after = shares.values()
    print(f"exposed communication share after / before = {after / before:.2f} ({before:.1%} -> {after:.1%}); {load()}")


if __name__ == "__main__":
    main()
