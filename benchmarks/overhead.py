"""trainscale's cnn workload vs the same training written by hand with plain DDP: step-time ratio.

    .venv/bin/python benchmarks/overhead.py [--repeats 3] [--epochs 3] [--nproc 2]

Both run 2 ranks on this machine (gloo), the same model, data, per-rank batch 16 and number of steps;
trainscale through `trainscale run --workload cnn`, the hand-written script through
`python -m torch.distributed.run`. Ratio = trainscale step time / plain step time (goal <= 1.02).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import PYTHON, ROOT, clean_env, load, median, read_json, run, verdict


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ts-overhead-"))
    env = clean_env()
    ours, plain = [], []
    for k in range(a.repeats):  # interleaved, so drifting load hits both alike
        m = tmp / f"ts-{k}.json"
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
                "cnn",
                "--epochs",
                str(a.epochs),
                "--batch-size",
                str(a.batch_size),
                "--log-every",
                "0",
                "--metrics-out",
                str(m),
            ],
            env=env,
            cwd=tmp,
        )
        d = read_json(m)
        ours.append(d["train_time_s"] / d["steps"])
        m = tmp / f"plain-{k}.json"
        run(
            [
                PYTHON,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                str(a.nproc),
                str(ROOT / "benchmarks" / "plain_ddp.py"),
                "--epochs",
                str(a.epochs),
                "--batch-size",
                str(a.batch_size),
                "--out",
                str(m),
            ],
            env=env,
            cwd=tmp,
        )
        plain.append(read_json(m)["step_time_s"])
        print(
            f"repeat {k + 1}: trainscale {ours[-1] * 1e3:.2f} ms/step, plain DDP {plain[-1] * 1e3:.2f} ms/step",
            flush=True,
        )
    ratio = median(ours) / median(plain)
    print(
        f"\noverhead: trainscale {median(ours) * 1e3:.2f} ms/step vs hand-written DDP {median(plain) * 1e3:.2f} "
        f"ms/step (median of {a.repeats}, {a.nproc} ranks, batch {a.batch_size}, {d['steps']} steps)"
    )
    print(f"ratio trainscale / plain = {ratio:.3f}: {verdict(ratio, 1.02, higher_is_better=False)}; {load()}")


if __name__ == "__main__":
    main()
