"""What recording costs: the cnn workload's step time with the loop's records, the node sampler and the
straggler watch on (the default under `trainscale run`) over the same run with TRAINSCALE_RECORD=0.

    .venv/bin/python benchmarks/record_overhead.py [--repeats 5] [--epochs 2] [--nproc 2] [--interval 1]

Both run N ranks on this machine (gloo), the same model, data, batch and steps; the sampler samples every
`--interval` seconds (1 here by default, so that it surely runs during the measurement; 5 is trainscale's
default). Ratio = step time recorded / step time
not recorded (goal <= 1.01). The FLOP count and the CPU peak probe run after training and are reported
separately, as end-to-end seconds.

On a shared 2-core host two runs of the same thing differ by several per cent, more than the goal, so the
script also times what recording adds directly, in this process: the step path's work (the phase marks,
turning them into a record, the buffered JSON line) per step, plus rank 0's straggler watch reading
each rank's new lines, and one sample of N ranks by the node sampler (psutil, the CPUs' reading, the
line written), which holds rank 0's interpreter while it runs. Their cost over the measured step time and
the sampling interval is the overhead they imply.
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
    per_step, per_sample = direct_costs(tmp / "direct", a.nproc)
    step_s = median(times["off"])
    implied = 1 + per_step / step_s + per_sample / a.interval
    print(f"direct cost: {per_step * 1e6:.1f} us per step ({per_step / step_s:.3%} of a {step_s * 1e3:.1f} ms step) + "
          f"{per_sample * 1e3:.2f} ms per sample of {a.nproc} ranks every {a.interval:g} s "
          f"({per_sample / a.interval:.3%}) = ratio {implied:.4f}: {verdict(implied, 1.01, higher_is_better=False)}")


def direct_costs(run_dir: Path, nproc: int, steps: int = 5000, samples: int = 200) -> tuple[float, float]:
    """Seconds the loop's recording adds per step, and one sample of ``nproc`` ranks takes (medians of 5)."""
    import time
    from types import SimpleNamespace

    import psutil
    import torch

    from trainscale.observe.records import RankRecorder
    from trainscale.observe.sampler import Sampler
    from trainscale.observe.stragglers import StragglerWatch
    from trainscale.train.timing import StepClock

    recorder = RankRecorder(run_dir, 0, world_size=nproc)
    marks = StepClock(SimpleNamespace(device=torch.device("cpu")), torch.nn.Linear(1, 1), record=True)
    sampler = Sampler(run_dir, interval_s=3600, gpu_reader=lambda: [])
    sampler.procs = [psutil.Process() for _ in range(nproc)]  # as many ranks to read as the runs had
    for p in sampler.procs:
        p.cpu_percent(None)
    watch = StragglerWatch(run_dir, say=print)
    step_costs, sample_costs = [], []
    for _ in range(5):
        began = time.perf_counter()
        for step in range(steps):
            marks.start_step()
            for phase in ("data", "forward", "backward", "optimizer"):
                with marks.phase(phase):
                    pass
            marks.end_step(step=step, samples=16)
            for record in marks.ready():
                recorder.step(record.pop("step"), record.pop("step_s"), **record)
        recording = (time.perf_counter() - began) / steps
        recorder.out.flush()
        began = time.perf_counter()
        watch.check()  # this rank's new lines; rank 0 reads every rank's
        step_costs.append(recording + nproc * (time.perf_counter() - began) / steps)
        began = time.perf_counter()
        for _ in range(samples):
            sampler.sample()
        sample_costs.append((time.perf_counter() - began) / samples)
    recorder.close()
    sampler.stop()
    return median(step_costs), median(sample_costs)


if __name__ == "__main__":
    main()
