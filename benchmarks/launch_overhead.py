"""`trainscale run` vs plain torchrun (`python -m torch.distributed.run`): launch-to-first-step time.

    .venv/bin/python benchmarks/launch_overhead.py [--repeats 5] [--nproc 2]

Both start the same trivial script (benchmarks/first_step.py: init the process group, one
all-reduce) on N local ranks. Launch-to-first-step = from just before the launcher process is
started to the moment rank 0's all-reduce returned. Ratio = trainscale / torchrun (goal <= 1.10).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from _common import PYTHON, ROOT, clean_env, load, median, run, verdict

SCRIPT = ROOT / "benchmarks" / "first_step.py"


def first_step(argv: list[str], marker: Path, cwd: Path) -> tuple[float, float]:
    """(launch-to-first-step, whole launch) seconds."""
    start = time.time()
    wall, _ = run(argv + [str(SCRIPT), str(marker)], env=clean_env(), cwd=cwd)
    return float(marker.read_text()) - start, wall


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--nproc", type=int, default=2)
    a = p.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ts-launch-"))
    ours, plain = [], []
    for k in range(a.repeats):
        ours.append(first_step([PYTHON, "-m", "trainscale", "run", "--nproc-per-node", str(a.nproc), "--log-dir",
                                str(tmp / "logs")], tmp / f"ts-{k}", tmp))
        plain.append(first_step([PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                 str(a.nproc)], tmp / f"plain-{k}", tmp))
        print(f"repeat {k + 1}: trainscale run {ours[-1][0]:.2f}s to first step ({ours[-1][1]:.2f}s total), "
              f"torchrun {plain[-1][0]:.2f}s ({plain[-1][1]:.2f}s total)", flush=True)
    o, t = median([x[0] for x in ours]), median([x[0] for x in plain])
    ow, tw = median([x[1] for x in ours]), median([x[1] for x in plain])
    print(f"\nlaunch to first step, {a.nproc} ranks (median of {a.repeats}): trainscale run {o:.2f}s, torchrun {t:.2f}s")
    print(f"ratio trainscale / torchrun = {o / t:.3f}: {verdict(o / t, 1.10, higher_is_better=False)} "
          f"(whole launch incl. teardown: {ow / tw:.3f}); {load()}")


if __name__ == "__main__":
    main()
