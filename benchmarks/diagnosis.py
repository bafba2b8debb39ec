"""How often a run's diagnosis names the right rank and phase: a plain 2-rank gloo DDP script
(tests/scripts/slow_rank.py, no trainscale import) under `trainscale run --nproc-per-node 2`, rank 1 losing
``--slow-ms`` per step in one place (its DataLoader, nanoGPT's fetch between forward and backward, its
forward, inside backward, after the optimizer step) or nowhere (clean, 2 micro-batches per step), ``--trials``
runs of each; scored from the run's records as `trainscale report` reads them (observe/stragglers.diagnose).

    .venv/bin/python benchmarks/diagnosis.py [--trials 5] [--steps 150] [--slow-ms 40]

A trial is right when the straggler named is rank 1 with the injected phase (clean: no straggler), and its
cause names no CPU binding (both ranks share the same CPUs here: no evidence). Its place is right when it is
the function and line of the injected delay (the script's line marked ``# place: <kind>``), sampled on rank 1
once the live watch (every 0.2 s here) named it: enough steps for the watch's 40 and rank 1's samples. Printed:
each kind's scores, what was named when wrong, and the totals.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from _common import PYTHON, ROOT, clean_env, load, run

SCRIPT = ROOT / "tests" / "scripts" / "slow_rank.py"
EXPECTED = {
    "loader": "loader",
    "between": "between",
    "forward": "forward",
    "backward": "backward",
    "after_step": "data",
    "clean": None,
}
FUNCTION = {
    "loader": "main.collate",
    "between": "main.get_batch",
    "forward": "Net.forward",
    "backward": "SlowBackward.backward",
    "after_step": "log_step",
}


def expected_place(kind: str) -> str | None:
    line = next(
        (i for i, text in enumerate(SCRIPT.read_text().splitlines(), 1) if text.endswith(f"# place: {kind}")), None
    )
    return f"{FUNCTION[kind]}:{line}" if kind in FUNCTION else None


def trial(kind: str, steps: int, slow_ms: float, where: Path) -> tuple[str | None, str | None]:
    """The diagnosis of one run as "rank/phase" (None: no straggler) and its place, "function:line" (or None)."""
    from trainscale.observe.records import read_run
    from trainscale.observe.stragglers import diagnose

    logs = where / "logs"
    env = clean_env(
        SLOW=kind,
        SLOW_S=str(slow_ms / 1e3),
        STEPS=str(steps),
        ACCUM="2" if kind == "clean" else "1",
        TRAINSCALE_STRAGGLER_EVERY="0.2",
    )
    run(
        [PYTHON, "-m", "trainscale", "run", "--nproc-per-node", "2", "--log-dir", str(logs), str(SCRIPT)],
        env=env,
        cwd=where,
    )
    (run_dir,) = [d for d in logs.iterdir() if (d / "metrics").is_dir() and not d.is_symlink()]
    found = diagnose(read_run(run_dir)["ranks"]).straggler
    if found is None:
        return None, None
    binding = "CPU binding" in found.cause or "shares CPU" in found.cause
    place = f"{found.place['function']}:{found.place['line']}" if found.place else None
    return f"{found.rank}/{found.phase}" + (" (CPU binding named)" if binding else ""), place


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--slow-ms", type=float, default=40.0)
    parser.add_argument("--kinds", default=",".join(EXPECTED), help="comma-separated, of: " + ", ".join(EXPECTED))
    args = parser.parse_args()
    print(load())
    right = placed = total = 0
    for kind in args.kinds.split(","):
        want, want_place = (f"1/{EXPECTED[kind]}" if EXPECTED[kind] else None), expected_place(kind)
        said, places = [], []
        for _ in range(args.trials):
            with tempfile.TemporaryDirectory(prefix="diagnosis-") as tmp:
                named, place = trial(kind, args.steps, args.slow_ms, Path(tmp))
                said.append(named)
                places.append(place)
        good, good_place = sum(s == want for s in said), sum(p == want_place for p in places)
        right, placed, total = right + good, placed + good_place, total + len(said)
        wrong = [s or "no straggler" for s in said if s != want]
        wrong_place = [p or "no place" for p in places if p != want_place]
        print(
            f"{kind:<11} {good}/{len(said)} right (expected {want or 'no straggler'})"
            + (f"; named instead: {', '.join(wrong)}" if wrong else "")
            + f"; place {good_place}/{len(places)} (expected {want_place or 'none'})"
            + (f"; placed instead: {', '.join(wrong_place)}" if wrong_place else ""),
            flush=True,
        )
    print(
        f"score: {right}/{total} = {right / total:.0%} rank and phase right; "
        f"{placed}/{total} = {placed / total:.0%} place right"
    )
    print(load())


if __name__ == "__main__":
    main()
