"""How often a run's diagnosis names the right rank and phase: a plain 2-rank gloo DDP script
(tests/scripts/slow_rank.py, no trainscale import) under `trainscale run --nproc-per-node 2`, rank 1 losing
``--slow-ms`` per step in one place (its DataLoader, nanoGPT's fetch between forward and backward, its
forward, inside backward, after the optimizer step) or nowhere (clean, 2 micro-batches per step), ``--trials``
runs of each; scored from the run's records as `trainscale report` reads them (observe/stragglers.diagnose).

    .venv/bin/python benchmarks/diagnosis.py [--trials 5] [--steps 20] [--slow-ms 40]

A trial is right when the straggler named is rank 1 with the injected phase (clean: no straggler), and its
cause names no CPU binding (both ranks share the same CPUs here: no evidence). Printed: each kind's score,
what was named when wrong, and the total.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import PYTHON, ROOT, clean_env, load, run

SCRIPT = ROOT / "tests" / "scripts" / "slow_rank.py"
EXPECTED = {"loader": "loader", "between": "between", "forward": "forward", "backward": "backward",
            "after_step": "data", "clean": None}


def trial(kind: str, steps: int, slow_ms: float, where: Path) -> str | None:
    """The diagnosis of one run as "rank/phase" (None: no straggler)."""
    from trainscale.observe.records import read_run
    from trainscale.observe.stragglers import diagnose

    logs = where / "logs"
    env = clean_env(SLOW=kind, SLOW_S=str(slow_ms / 1e3), STEPS=str(steps), ACCUM="2" if kind == "clean" else "1")
    run([PYTHON, "-m", "trainscale", "run", "--nproc-per-node", "2", "--log-dir", str(logs), str(SCRIPT)], env=env,
        cwd=where)
    (run_dir,) = [d for d in logs.iterdir() if (d / "metrics").is_dir() and not d.is_symlink()]
    found = diagnose(read_run(run_dir)["ranks"]).straggler
    if found is None:
        return None
    binding = "CPU binding" in found.cause or "shares CPU" in found.cause
    return f"{found.rank}/{found.phase}" + (" (CPU binding named)" if binding else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--slow-ms", type=float, default=40.0)
    parser.add_argument("--kinds", default=",".join(EXPECTED), help="comma-separated, of: " + ", ".join(EXPECTED))
    args = parser.parse_args()
    print(load())
    right = total = 0
    for kind in args.kinds.split(","):
        want = f"1/{EXPECTED[kind]}" if EXPECTED[kind] else None
        said = []
        for _ in range(args.trials):
            with tempfile.TemporaryDirectory(prefix="diagnosis-") as tmp:
                said.append(trial(kind, args.steps, args.slow_ms, Path(tmp)))
        good = sum(s == want for s in said)
        right, total = right + good, total + len(said)
        wrong = [s or "no straggler" for s in said if s != want]
        print(f"{kind:<11} {good}/{len(said)} right (expected {want or 'no straggler'})"
              + (f"; named instead: {', '.join(wrong)}" if wrong else ""), flush=True)
    print(f"score: {right}/{total} = {right / total:.0%} rank and phase right")
    print(load())


if __name__ == "__main__":
    main()
