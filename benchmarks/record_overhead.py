"""What recording costs: the cnn workload's step time with the loop's records, the node sampler and the
straggler watch on (the default under `trainscale run`) over the same run with TRAINSCALE_RECORD=0.

    .venv/bin/python benchmarks/record_overhead.py [--repeats 5] [--epochs 2] [--nproc 2] [--interval 1]

Both run N ranks on this machine (gloo), the same model, data, batch and steps; the sampler samples every
`--interval` seconds (1 here by default, so that it surely runs during the measurement; 5 is trainscale's
default). Ratio = step time recorded / step time
not recorded (goal <= 1.01). The FLOP count and the CPU peak probe run after training and are reported
separately, as end-to-end seconds.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import PYTHON, clean_env, load, median, read_json, run, verdict


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--interval", type=float, default=1.0, help="the sampler's seconds between samples")
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ts-record-"))
    times: dict[str, list[float]] = {"on": [], "off": []}
    walls: dict[str, list[float]] = {"on": [], "off": []}
    steps = 0
    for k in range(a.repeats):  # interleaved, so drifting load hits both alike
        for mode in ("on", "off") if k % 2 == 0 else ("off", "on"):
            env = clean_env(TRAINSCALE_SAMPLE_INTERVAL=f"{a.interval:g}", TRAINSCALE_RECORD="1" if mode == "on" else "0")
            out = tmp / f"{mode}-{k}.json"
            took, _ = run([PYTHON, "-m", "trainscale", "run", "--nproc-per-node", str(a.nproc), "--log-dir",
                           str(tmp / "logs"), "--workload", "cnn", "--epochs", str(a.epochs), "--log-every", "0",
                           "--metrics-out", str(out)], env=env, cwd=tmp)
            d = read_json(out)
            steps = d["steps"]
            times[mode].append(d["train_time_s"] / d["steps"])
            walls[mode].append(took)
        print(f"repeat {k + 1}: recorded {times['on'][-1] * 1e3:.2f} ms/step, not recorded "
              f"{times['off'][-1] * 1e3:.2f} ms/step", flush=True)
    recorded = list((tmp / "logs").glob("*/metrics/rank-0.jsonl"))
    assert len(recorded) == a.repeats, "every recorded run wrote its records"
    ratio = median(times["on"]) / median(times["off"])
    print(f"\nrecording: {median(times['on']) * 1e3:.2f} ms/step vs {median(times['off']) * 1e3:.2f} ms/step without "
          f"(median of {a.repeats}, {a.nproc} ranks, {steps} steps, sampling every {a.interval:g} s)")
    print(f"ratio recorded / not recorded = {ratio:.3f}: {verdict(ratio, 1.01, higher_is_better=False)}")
    print(f"end to end: {median(walls['on']):.1f}s vs {median(walls['off']):.1f}s (FLOP count and peak probe at the "
          f"end included); {load()}")


if __name__ == "__main__":
    main()
