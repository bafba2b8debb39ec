"""trainscale's cnn workload vs seed 004's script style, one CPU process each: end-to-end ratio and data share.

    .venv/bin/python benchmarks/seed_style.py [--repeats 3] [--epochs 3]

Same model, same digits, batch 16, same epochs. The seed style feeds each sample through PIL ->
ToTensor -> Normalize in a DataLoader; trainscale keeps the normalised set as one tensor and slices
batches by index. Ratio = seed-style time / trainscale time (goal >= 1.0 on this CPU, where the
step is compute-bound; trainscale's data share should be <= 1%). End to end = the whole process,
python start to exit; the training-loop time (epochs only) is printed too.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import PYTHON, ROOT, clean_env, load, median, read_json, run, verdict

from trainscale.observe.reading import run_timing


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--threads", default="1", help="OMP_NUM_THREADS for both (1 is stable on a busy machine)")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ts-seed-"))
    env = clean_env(OMP_NUM_THREADS=a.threads)
    rows = {"trainscale": [], "seed": []}
    for k in range(a.repeats):
        m, records = tmp / f"ts-{k}.json", tmp / f"ts-{k}"
        wall, _ = run(
            [
                PYTHON,
                "-m",
                "trainscale.workloads",
                "cnn",
                "--epochs",
                str(a.epochs),
                "--batch-size",
                "16",
                "--log-every",
                "0",
                "--metrics-out",
                str(m),
            ],
            env={**env, "TRAINSCALE_RUN_DIR": str(records)},
            cwd=tmp,
        )
        d = read_json(m)
        timing = run_timing(records)  # the data wait's share of the step, from the step records
        rows["trainscale"].append((wall, d["train_time_s"], timing["breakdown"]["data"] / timing["step_time_s"]))
        m = tmp / f"seed-{k}.json"
        wall, _ = run(
            [PYTHON, str(ROOT / "benchmarks" / "seed_style_train.py"), "--epochs", str(a.epochs), "--out", str(m)],
            env=env,
            cwd=tmp,
        )
        s = read_json(m)
        rows["seed"].append((wall, s["train_time_s"], s["data_s"] / s["train_time_s"]))
        print(
            f"repeat {k + 1}: trainscale {rows['trainscale'][-1][0]:.1f}s end to end "
            f"({rows['trainscale'][-1][1]:.1f}s training, data {rows['trainscale'][-1][2]:.2%}); seed style "
            f"{rows['seed'][-1][0]:.1f}s ({rows['seed'][-1][1]:.1f}s training, data {rows['seed'][-1][2]:.1%})",
            flush=True,
        )
    ts = [median([r[i] for r in rows["trainscale"]]) for i in range(3)]
    sd = [median([r[i] for r in rows["seed"]]) for i in range(3)]
    print(
        f"\nseed style vs trainscale, {a.epochs} epochs of digits, batch 16, OMP_NUM_THREADS={a.threads} "
        f"(median of {a.repeats}):"
    )
    print(
        f"  end to end : seed {sd[0]:.2f}s / trainscale {ts[0]:.2f}s = {sd[0] / ts[0]:.2f}x: "
        f"{verdict(sd[0] / ts[0], 1.0, higher_is_better=True)}"
    )
    print(f"  training   : seed {sd[1]:.2f}s / trainscale {ts[1]:.2f}s = {sd[1] / ts[1]:.2f}x")
    print(
        f"  data share : seed {sd[2]:.1%} of the training loop, trainscale {ts[2]:.2%} "
        f"({'meets' if ts[2] <= 0.01 else 'misses'} the <= 1% goal); {load()}"
    )


if __name__ == "__main__":
    main()
