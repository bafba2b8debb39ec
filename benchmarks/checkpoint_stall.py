"""Training stall per checkpoint, background (--checkpoint-async) vs synchronous saves: a ratio.

    .venv/bin/python benchmarks/checkpoint_stall.py [--repeats 3] [--nproc 2] [--strategy ddp]

Runs the gpt workload through `trainscale run` (default 2 ranks, gloo on this machine), made wide
enough that a checkpoint is ~88 MB (7.3 M parameters + Adam's two moments), saving every 4 steps, once
with `--checkpoint-async` and once with `--no-checkpoint-async`, interleaved. The stall of a save is
what the loop records in `--metrics-out` (`checkpoint_stall_s`, rank 0): the seconds training waited
in it (the previous save, staging, and for a synchronous save the whole write, fsync and rename).
Per run the median over its saves, then the median over repeats. Ratio = background / synchronous
(goal <= 0.2). The whole training time is printed too: on a small CPU machine the background write
competes with training for the cores, which the stall does not show.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import PYTHON, clean_env, load, median, read_json, run, verdict

MODES = {"async": "--checkpoint-async", "sync": "--no-checkpoint-async"}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--strategy", default="ddp", help="ddp/zero1 (a rank-0 file) or fsdp (DCP shards)")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--every", type=int, default=4, help="--checkpoint-every")
    p.add_argument("--n-embd", type=int, default=384)
    p.add_argument("--n-layer", type=int, default=4)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ts-ckpt-stall-"))
    env = clean_env()
    stall: dict[str, list[float]] = {m: [] for m in MODES}
    train: dict[str, list[float]] = {m: [] for m in MODES}
    size_mb = 0.0
    for k in range(a.repeats):  # interleaved, so drifting load hits both alike
        for mode, flag in MODES.items():
            exp, metrics = tmp / f"{mode}-{k}", tmp / f"{mode}-{k}.json"
            run(
                [
                    PYTHON,
                    "-m",
                    "trainscale",
                    "run",
                    "--nproc-per-node",
                    str(a.nproc),
                    "--log-dir",
                    str(tmp / "logs"),
                    "--workload",
                    "gpt",
                    "--strategy",
                    a.strategy,
                    "--max-steps",
                    str(a.steps),
                    "--checkpoint-every",
                    str(a.every),
                    "--n-embd",
                    str(a.n_embd),
                    "--n-layer",
                    str(a.n_layer),
                    "--seq-len",
                    "32",
                    "--batch-size",
                    "4",
                    "--log-every",
                    "0",
                    "--experiment-dir",
                    str(exp),
                    flag,
                    "--metrics-out",
                    str(metrics),
                ],
                env=env,
                cwd=tmp,
                timeout=900,
            )
            d = read_json(metrics)
            if d["checkpoint_async"] != (mode == "async"):
                raise SystemExit(f"{mode} run reports checkpoint_async={d['checkpoint_async']}")
            stall[mode].append(median(d["checkpoint_stall_s"]))
            train[mode].append(d["train_time_s"])
            size_mb = sum(f.stat().st_size for f in (exp / "checkpoints").rglob("*") if f.is_file()) / 2**20
            saves = len(d["checkpoint_stall_s"])
        print(
            f"repeat {k + 1}: stall per save async {stall['async'][-1] * 1e3:.1f} ms, sync "
            f"{stall['sync'][-1] * 1e3:.1f} ms; training async {train['async'][-1]:.2f} s, sync "
            f"{train['sync'][-1]:.2f} s",
            flush=True,
        )
    ratio = median(stall["async"]) / median(stall["sync"])
    print(
        f"\ncheckpoint stall: async {median(stall['async']) * 1e3:.1f} ms vs sync {median(stall['sync']) * 1e3:.1f} ms "
        f"per save (median of {a.repeats}, {saves} saves of ~{size_mb / 2:.0f} MB each, {a.nproc} ranks, "
        f"{a.strategy}); training time async {median(train['async']):.2f} s vs sync {median(train['sync']):.2f} s"
    )
    print(f"ratio async / sync = {ratio:.3f}: {verdict(ratio, 0.2, higher_is_better=False)}; {load()}")


if __name__ == "__main__":
    main()
