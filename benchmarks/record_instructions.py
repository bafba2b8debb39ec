"""What observing a tiny step costs in machine instructions: a count that does not move with the machine's load.

    .venv/bin/python benchmarks/record_instructions.py [--steps 1000] [--src OTHER/src]

Each tiny loop of ``record_overhead.py`` (the DDP tutorial's ToyModel; nanoGPT's shape) runs under valgrind's
callgrind, not observed and observed (the recorder installed, settled, its flushing thread idle: the training
thread's part only), and the instructions executed inside ``functools.reduce`` over ``--steps`` steps are
counted (callgrind's ``--toggle-collect``; instrumentation switched on just before, so importing torch is not
slowed). The figure is the difference per step. ``--src`` measures another tree's recorder (a worktree of an
older commit) in the same run, for a before/after. Python's hash seed is fixed; runs of the same code still
differ by a few hundred instructions a step. Needs valgrind; a minute or two per run.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _common import PYTHON, ROOT

CHILD = """
import functools, os, subprocess, sys, tempfile
from pathlib import Path
sys.path.insert(0, {bench!r})
import torch
import record_overhead
from trainscale.observe import hooks
from trainscale.observe.sampler import INTERVAL_VAR

torch.set_num_threads(1)
name, observe, steps = sys.argv[1], sys.argv[2] == "on", int(sys.argv[3])
step = next(s for k, s in record_overhead.tiny_loops().items() if k.startswith(name))
recorder = None
if observe:
    hooks.FLUSH_EVERY_S = 1e9  # the records' thread stays idle: the training thread's instructions only
    environ = {{INTERVAL_VAR: "0", "TRAINSCALE_STRAGGLER_EVERY": "0"}}
    recorder = hooks.Recorder(Path(tempfile.mkdtemp()) / "records", environ=environ).install()
    recorder.flops_per_step = 0
for _ in range(hooks.SETTLE_STEPS + 5):
    step()
subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], capture_output=True)
functools.reduce(lambda carried, _: step() or carried, range(steps), 0)
if recorder is not None:
    recorder.finish()
"""


def instructions(loop: str, observe: bool, steps: int, src: str | None) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        child, out = Path(tmp) / "child.py", Path(tmp) / "callgrind.out"
        child.write_text(CHILD.format(bench=str(ROOT / "benchmarks")))
        env = {**os.environ, "PYTHONHASHSEED": "0", **({"PYTHONPATH": src} if src else {})}
        done = subprocess.run(
            ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--collect-atstart=no",
             "--toggle-collect=*functools_reduce*", f"--callgrind-out-file={out}",
             PYTHON, str(child), loop, "on" if observe else "off", str(steps)],
            env=env, capture_output=True, text=True, check=False,
        )  # fmt: skip
        found = re.search(r"Collected : (\d+)", done.stderr)
        if done.returncode or not found:
            sys.exit(f"valgrind failed: {done.stderr[-400:]}")
        return int(found.group(1))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--src", help="another tree's src/ to measure beside this one (e.g. a worktree of HEAD~1)")
    a = p.parse_args()
    if not shutil.which("valgrind"):
        sys.exit("this benchmark needs valgrind (apt install valgrind)")
    for loop, label in (("DDP", "DDP tutorial's ToyModel"), ("nanoGPT", "nanoGPT-style, 2 micro-batches")):
        off = instructions(loop, False, a.steps, None)
        trees = {"this tree": None, **({a.src: a.src} if a.src else {})}
        added = {name: (instructions(loop, True, a.steps, src) - off) / a.steps for name, src in trees.items()}
        print(
            f"{label}: {off / a.steps / 1e3:.0f}k instructions a step not observed; observation adds "
            + ", ".join(f"{n / 1e3:+.1f}k ({name})" for name, n in added.items()),
            flush=True,
        )


if __name__ == "__main__":
    main()
