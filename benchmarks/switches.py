"""The one-switch options' effect on the cnn's 2-rank DDP step: each switch's throughput over plain ddp.

    .venv/bin/python benchmarks/switches.py [--repeats 3] [--epochs 2] [--nproc 2] [--only NAME,...]

Every case is `trainscale run --nproc-per-node 2 --workload cnn` (timed from its step records) with the same
data, batch and steps, interleaved per repeat so drifting load hits all alike: plain `ddp` (here: the shared-memory
average `auto` picks for CPU ranks on one node), `ddp:comm_hook=none` (gloo's all-reduce, overlapped), the
communication hooks `ddp:comm_hook=fp16|bf16|powersgd`, `zero1` (the optimizer step sharded), and
`--compile` (torch.compile of the wrapped model). Throughput is the steady steps' (after the warm-up), so
torch.compile's first-epoch compilation is reported apart (as the first epoch's extra seconds) instead
of hiding in the ratio. Ratio = samples/s of the case / samples/s of plain ddp (median over repeats),
with the exposed communication and optimizer time per step beside it. On gloo and CPU the hooks only
shrink the bytes sent; their compression costs compute that a 2-core machine does not have spare, so a
ratio below 1.0 here is a measurement, not a bug: they pay off where the network, not the cores, is slow.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import PYTHON, clean_env, load, median, read_json, recorded, run

CASES = {
    "ddp": ["--strategy", "ddp"],
    "ddp:comm_hook=none": ["--strategy", "ddp:comm_hook=none"],
    "ddp:comm_hook=fp16": ["--strategy", "ddp:comm_hook=fp16"],
    "ddp:comm_hook=bf16": ["--strategy", "ddp:comm_hook=bf16"],
    "ddp:comm_hook=powersgd": ["--strategy", "ddp:comm_hook=powersgd"],
    "zero1": ["--strategy", "zero1"],
    "ddp --compile": ["--strategy", "ddp", "--compile"],
}


def measure(tmp: Path, name: str, args: list[str], a: argparse.Namespace) -> dict:
    metrics, logs = tmp / f"{name}.json", tmp / "logs" / name
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
            "--metrics-out",
            str(metrics),
            *args,
        ],
        env=clean_env(),
        cwd=tmp,
        timeout=900,
    )
    epochs = read_json(metrics)["epochs"]  # the loop's epoch wall times: what the first one's compilation costs
    timing = recorded(logs)  # the steady step and its sections, from the step records
    per_step = timing["steady"]["step_time_s"]
    out = {
        "rate": a.nproc * a.batch_size / per_step,
        "step": per_step,
        "first": epochs[0]["time_s"] - epochs[-1]["time_s"],
    }
    for key in ("communication", "optimizer"):
        out[key] = timing["breakdown"][key]
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--only", default=None, help="comma-separated case names (ddp is always measured)")
    a = p.parse_args()
    if a.epochs < 2:
        raise SystemExit("--epochs must be >= 2: the last epoch is timed, the first holds compilation")
    cases = CASES if not a.only else {k: v for k, v in CASES.items() if k == "ddp" or k in a.only.split(",")}
    tmp = Path(tempfile.mkdtemp(prefix="ts-switches-"))
    seen: dict[str, list[dict]] = {name: [] for name in cases}
    for k in range(a.repeats):
        for i, (name, args) in enumerate(cases.items()):
            m = measure(tmp, f"{i}-{k}", args, a)
            seen[name].append(m)
            print(f"repeat {k + 1} {name}: {m['rate']:.0f} samples/s, step {m['step'] * 1e3:.1f} ms", flush=True)
    base = median([m["rate"] for m in seen["ddp"]])
    print(f"\n{'case':<24} {'samples/s':>10} {'x ddp':>7} {'exposed comm':>13} {'optimizer':>10} {'1st epoch +s':>13}")
    for name, ms in seen.items():
        rate = median([m["rate"] for m in ms])
        print(
            f"{name:<24} {rate:>10.0f} {rate / base:>7.2f} {median([m['communication'] for m in ms]) * 1e3:>10.1f} ms"
            f" {median([m['optimizer'] for m in ms]) * 1e3:>7.1f} ms {median([m['first'] for m in ms]):>12.2f}"
        )
    print(f"(steady steps timed, median of {a.repeats}, {a.nproc} ranks, batch {a.batch_size} per rank); {load()}")


if __name__ == "__main__":
    main()
