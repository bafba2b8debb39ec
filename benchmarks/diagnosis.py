"""How often a run's diagnosis names the right rank, phase, place and cost: plain user scripts (no trainscale
import) under `trainscale run --nproc-per-node N`, with a fault injected on one rank, ``--trials`` runs of each.

- tests/scripts/slow_rank.py, wrapped as ``--strategies`` say: ``ddp`` (DistributedDataParallel), ``zero1``
  (DDP + ZeroRedundancyOptimizer), ``fsdp`` (FSDP2's ``fully_shard`` per layer: all-gathers in forward) or
  ``deepspeed:stage=N`` (DeepSpeed's engine, ZeRO stage N: its own backward and step),
  rank 1 losing ``--slow-ms`` per step in its DataLoader, nanoGPT's fetch between forward and backward, its
  forward, inside backward, its optimizer step, after the step; rank 0 evaluating between steps (``eval``), or
  for 10x as long every 10 steps (``eval_every``); each step one rank after its step, each once a round of
  world-size steps in a drawn order (``turns``: right when no straggler is named and the turns are said);
  ``busy``: each rank pinned to a CPU of its own, computing for most of its step (a wider layer, larger
  batches), and two other processes spinning on rank 1's CPU (2 ranks only); or
  nowhere (``clean``, 2 micro-batches per step). Scored from the run's records as `trainscale report` reads
  them (observe/stragglers.diagnose): right when the straggler named is the injected rank with the injected
  phase (``busy``: rank 1, any phase, and contention named with its run-queue figure; clean: no straggler) and
  no cause it has no evidence of (CPU binding, shared CPUs: none here). Its place is right when it is the
  function and line of the injected delay (the script's line marked ``# place: <kind>``), sampled once the
  live watch (every 0.2 s here) named it. Its cost: the wait it names per step against the injected delay.
- tests/scripts/desync.py (``skip``, ``extra``, ``shape``: rank 1 skips a collective, adds one, passes another
  shape at step 3; its strategy is its own all-reduces): right when the run's root cause names rank 1's desync
  and the line marked ``# desync: <kind>`` is named before any traceback, the run ended by trainscale (124).
- ``--workload trainer``: tests/scripts/slow_trainer.py, an HF ``Trainer`` (its own DDP), rank 1 slow in its
  collator or its forward, or clean; ``--workload cnn``: the built-in workload, clean runs only.

    .venv/bin/python benchmarks/diagnosis.py [--trials 5] [--steps 100] [--slow-ms 40] \\
        [--strategies ddp,zero1,fsdp] [--nprocs 2,4] [--kinds ...] [--workload trainer|cnn] [--out results.jsonl]
    .venv/bin/python benchmarks/diagnosis.py --table results.jsonl   # the table of docs/observability.md

Each trial prints a line as it ends (and appends it to ``--out``); then each kind's scores and the totals.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from _common import PYTHON, ROOT, clean_env, load

SCRIPT = ROOT / "tests" / "scripts" / "slow_rank.py"
TRAINER = ROOT / "tests" / "scripts" / "slow_trainer.py"
TRAINER_FUNCTION = {"loader": "collate", "forward": "Net.forward"}
"""The HF Trainer script's kinds (its strategy is the Trainer's DDP) and their places."""
WORKLOAD_KINDS = {"trainer": ("clean", "loader", "forward")}
"""What each ``--workload`` runs (a built-in workload: clean only, nothing to inject there without changing it)."""
DESYNC = ROOT / "tests" / "scripts" / "desync.py"
EXPECTED = {
    "loader": (1, "loader"),
    "between": (1, "between"),
    "forward": (1, "forward"),
    "backward": (1, "backward"),
    "optimizer": (1, "optimizer"),
    "after_step": (1, "data"),
    "eval": (0, "data"),
    "eval_every": (0, "data"),
    "checkpointed": (1, "forward+backward"),
    "turns": ("turns", "data"),
    "busy": (1, "*"),
    "clean": None,
}
"""Kind -> the rank and phase the diagnosis must name ("*": any phase; None: no straggler; "turns": no straggler, the
ranks taking turns said, in that phase)."""
FUNCTION = {
    "loader": "main.collate",
    "between": "main.get_batch",
    "forward": "Net.forward",
    "backward": "SlowBackward.backward",
    "optimizer": "SlowSGD.step",
    "after_step": "log_step",
    "eval": "evaluate",
    "eval_every": "evaluate",
    "checkpointed": "Net.block",
}
EVERY = 10
"""``eval_every``: rank 0 evaluates every this many steps, for this many times ``--slow-ms`` (the same cost per step
on average, in some steps only)."""
DESYNCS = ("skip", "extra", "shape")
UNFOUNDED = ("CPU binding", "shares CPU")
BUSY = 2
"""Processes spinning on rank 1's CPU in the busy kind: one is lost among a shared machine's other work."""


def marked(path: Path, mark: str) -> int | None:
    return next((i for i, text in enumerate(path.read_text().splitlines(), 1) if text.endswith(mark)), None)


def expected_place(kind: str, script: str = "slow_rank") -> str | None:
    if kind in DESYNCS:
        return f"desync.py:{marked(DESYNC, f'# desync: {kind}')}"
    path, function = (TRAINER, TRAINER_FUNCTION) if script == "trainer" else (SCRIPT, FUNCTION)
    mark = "eval" if kind == "eval_every" else kind
    return f"{function[kind]}:{marked(path, f'# place: {mark}')}" if kind in function else None


def spinners(cpu: int, n: int = BUSY) -> list[subprocess.Popen]:
    """Other busy processes on ``cpu`` (what a rank sharing its cores meets)."""
    code = f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"
    return [subprocess.Popen([PYTHON, "-c", code]) for _ in range(n)]


SCRIPT_VARS = (
    *("SLOW", "SLOW_S", "STEPS", "ACCUM", "STRATEGY", "BIND", "WIDTH", "BATCH", "EVERY"),
    "TRAINSCALE_STRAGGLER_EVERY",
)
"""What the slow-rank script reads from its environment: handed to a SLURM job with ``--env``."""


def launch(
    nproc: int, target: list[str], env: dict[str, str], where: Path, slurm: tuple[Any, str] | None = None
) -> subprocess.CompletedProcess:
    """``trainscale run`` here, or with ``slurm`` (the test cluster, a launcher mode) one rank on each of ``nproc``
    nodes as a SLURM job, watched to its end; either way the run directory is under ``where/logs``."""
    if slurm is None:
        argv = [PYTHON, "-m", "trainscale", "run", "--nproc-per-node", str(nproc), "--log-dir", "logs", *target]
        return subprocess.run(argv, env=env, cwd=where, capture_output=True, text=True, timeout=400)
    cluster, mode = slurm
    passed = [arg for name in SCRIPT_VARS if name in env for arg in ("--env", f"{name}={env[name]}")]
    argv = [
        *(PYTHON, "-m", "trainscale", "slurm", "--profile", "local-test", "-N", str(nproc), "--gpus-per-node", "1"),
        *("-t", "00:10:00", "--launcher", mode, "--python", PYTHON, "--output-dir", str(where / "logs"), *passed),
        *("--env", "OMP_NUM_THREADS=1", "--submit", "--watch", "--poll", "0.5", "--watch-timeout", "400", *target),
    ]
    return subprocess.run(argv, env={**env, **cluster.env}, cwd=where, capture_output=True, text=True, timeout=500)


def workload(name: str, strategy: str, steps: int) -> list[str]:
    """A built-in workload's command line: small synthetic batches on the CPU."""
    size = ["--max-steps", str(steps), "--batch-size", "8", "--device", "cpu", "--data", "synthetic"]
    return ["--workload", name, "--strategy", strategy, *size]


def straggler_trial(
    kind: str,
    strategy: str,
    nproc: int,
    steps: int,
    slow_ms: float,
    where: Path,
    built_in: str | None = None,
    slurm: tuple[Any, str] | None = None,
) -> dict:
    from trainscale.observe.records import read_run
    from trainscale.observe.stragglers import diagnose

    every = EVERY if kind == "eval_every" else 1
    env = clean_env(
        SLOW={"busy": "clean", "eval_every": "eval"}.get(kind, kind),
        SLOW_S=str(every * slow_ms / 1e3),
        EVERY=str(every),
        STEPS=str(steps),
        ACCUM="2" if kind == "clean" else "1",
        STRATEGY=strategy,
        BIND="1" if kind == "busy" else "0",
        # a rank that waits most of its step sleeps in the collectives and is woken first: the busy kind's
        # ranks compute for most of theirs, where sharing a CPU slows them
        **({"WIDTH": "4096", "BATCH": "256"} if kind == "busy" else {}),
        TRAINSCALE_STRAGGLER_EVERY="0.2",
    )
    busy = spinners(1) if kind == "busy" else []
    try:
        # a built-in workload runs clean: nothing to inject there without changing it
        target = [str(TRAINER)] if built_in == "trainer" else workload(built_in, strategy, steps) if built_in else None
        done = launch(nproc, target or [str(SCRIPT)], env, where, slurm)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    if done.returncode != 0:
        return {"named": f"run failed ({done.returncode}): {done.stderr.strip().splitlines()[-1:]}"}
    (run_dir,) = {d.parent.resolve() for d in (where / "logs").rglob("metrics") if d.is_dir()}
    why: list[str] = []
    diagnosis = diagnose(read_run(run_dir)["ranks"], why=why)
    found = diagnosis.straggler
    if found is None and diagnosis.turns is not None:
        return {"named": f"turns/{diagnosis.turns.phase}", "late_ms": round(diagnosis.turns.late_s * 1e3, 1)}
    if found is None:
        return {"named": None, "why": "; ".join(why) or None}  # the rule that named none
    return {
        "named": f"{found.rank}/{found.phase}",
        "cause": found.cause,
        "place": f"{found.place['function']}:{found.place['line']}" if found.place else None,
        "late_ms": round(found.late_s * 1e3, 1),
        "spikes": found.spikes,  # named by its means, held up in some steps only
    }


def desync_trial(kind: str, nproc: int, where: Path) -> dict:
    env = clean_env()
    done = launch(nproc, [str(DESYNC), kind], env, where)
    err = done.stderr
    root = next((line for line in err.splitlines() if line.startswith("Root cause:")), "")
    named = "1/desync" if "rank(s) 1 called a different collective" in root and done.returncode == 124 else root
    crash = err.find("Traceback")
    # the lines the notice names, for each rank, before any traceback: a skip's is where the others wait
    lines = sorted(
        {f"desync.py:{m}" for m in re.findall(r"issued at \S*desync\.py:(\d+)", err[: crash if crash >= 0 else None])}
    )
    want = expected_place(kind)
    return {"named": named or f"exit {done.returncode}", "place": want if want in lines else ", ".join(lines) or None}


def score(kind: str, result: dict, slow_ms: float, script: str = "slow_rank") -> dict:
    named = result.get("named")
    if kind in DESYNCS:
        want = "1/desync"
        right = named == want
    elif EXPECTED[kind] is None:
        want = None
        right = named is None
    else:
        rank, phase = EXPECTED[kind]
        want = f"{rank}/{phase}"
        right = bool(named) and named.split("/")[0] == str(rank) and phase in ("*", named.split("/", 1)[1])
        cause = result.get("cause") or ""
        right = right and not any(u in cause for u in UNFOUNDED)
        if kind == "busy":
            right = right and "waited for a CPU" in cause
    place = expected_place(kind, script)
    cost = result["late_ms"] / slow_ms if result.get("late_ms") and kind in FUNCTION else None
    return {"want": want, "right": right, "want_place": place, "placed": result.get("place") == place, "cost": cost}


def table(path: Path) -> None:
    """The results in ``path`` as docs/observability.md's table: per configuration and kind."""
    rows: dict[tuple, list[dict]] = defaultdict(list)
    for line in path.read_text().splitlines():
        r = json.loads(line)
        rows[(r["script"], r["strategy"], r["nproc"], r["kind"])].append(r)
    head = "script | strategy | ranks | kind | trials | rank+phase right | place right | cost named / injected | load"
    print(f"| {head} | named instead |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (script, strategy, nproc, kind), rs in sorted(
        rows.items(), key=lambda kv: (kv[0][:3], list(EXPECTED).index(kv[0][3]) if kv[0][3] in EXPECTED else 99)
    ):
        placed = f"{sum(r['placed'] for r in rs)}/{len(rs)}" if rs[0]["want_place"] else "—"
        costs = [r["cost"] for r in rs if r.get("cost")]
        cost = f"{statistics.median(costs):.2f}" if costs else "—"
        loads = [r["load"] for r in rs]
        wrong = defaultdict(int)
        for r in rs:
            if not r["right"]:
                wrong[
                    (r["named"] or "nothing") + (" + its CPU wait" if "waited for a CPU" in r.get("cause", "") else "")
                ] += 1
        instead = "; ".join(f"{named} ×{n}" for named, n in wrong.items()) or "—"
        print(
            f"| {script} | {strategy} | {nproc} | {kind} | {len(rs)} | {sum(r['right'] for r in rs)}/{len(rs)} | "
            f"{placed} | {cost} | {min(loads):.0f}–{max(loads):.0f} | {instead} |"
        )
    everything = [r for rs in rows.values() for r in rs]
    injected = [r for r in everything if r["kind"] != "clean"]
    with_place = [r for r in everything if r["want_place"]]
    clean = [r for r in everything if r["kind"] == "clean"]
    print(
        f"\ninjected: {sum(r['right'] for r in injected)}/{len(injected)} rank and phase right; "
        f"place {sum(r['placed'] for r in with_place)}/{len(with_place)}; "
        f"clean: {sum(r['right'] for r in clean)}/{len(clean)} with nothing named"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--slow-ms", type=float, default=40.0)
    parser.add_argument("--strategies", default="ddp")
    parser.add_argument("--nprocs", default="2")
    parser.add_argument("--kinds", default=",".join([*EXPECTED, *DESYNCS]))
    parser.add_argument(
        "--workload",
        help="a built-in workload (cnn: clean runs only) or `trainer` (the HF Trainer script: loader, forward, "
        "clean) instead of the plain script",
    )
    parser.add_argument(
        "--slurm",
        help="launcher modes (torchrun,srun): each trial as a job on the SLURM test cluster (tests/slurm/cluster.sh), "
        "one rank on each of --nprocs nodes, instead of here; the straggler kinds only",
    )
    parser.add_argument("--out", type=Path, help="append each trial's result here (JSON lines)")
    parser.add_argument("--table", type=Path, help="print the table of the results in this file, run nothing")
    args = parser.parse_args()
    if args.table:
        return table(args.table)
    if args.slurm and args.nprocs != "2":
        parser.error("--slurm runs one rank on each node of the 2-node test cluster: give --nprocs 2")
    print(load(), flush=True)
    with contextlib.ExitStack() as stack:
        if args.slurm:
            sys.path.insert(0, str(ROOT / "tests"))
            from helpers.slurm_cluster import cluster_session

            cluster = stack.enter_context(cluster_session(2))
        for mode in args.slurm.split(",") if args.slurm else [None]:
            trials(args, (cluster, mode) if mode else None)


def trials(args: argparse.Namespace, slurm: tuple[Any, str] | None) -> None:
    """Every kind's trials, here or (``slurm``) as jobs on the test cluster in one launcher mode."""
    totals: dict[str, list[dict]] = defaultdict(list)
    for nproc in map(int, args.nprocs.split(",")):
        for strategy in args.strategies.split(","):
            for kind in args.kinds.split(","):
                # the desync script has its own collectives; one spinning CPU of two: 2 ranks
                if kind in DESYNCS and (strategy != "ddp" or slurm) or kind == "busy" and (nproc != 2 or slurm):
                    continue
                if args.workload and kind not in WORKLOAD_KINDS.get(args.workload, ("clean",)):
                    continue
                for _ in range(args.trials):
                    with tempfile.TemporaryDirectory(prefix="diagnosis-") as tmp:
                        if kind in DESYNCS:
                            result = desync_trial(kind, nproc, Path(tmp))
                        else:
                            result = straggler_trial(
                                kind, strategy, nproc, args.steps, args.slow_ms, Path(tmp), args.workload, slurm
                            )
                    script = "desync" if kind in DESYNCS else (args.workload or "slow_rank")
                    row = {
                        "script": f"{script}, SLURM {slurm[1]} mode" if slurm else script,
                        "strategy": "own" if kind in DESYNCS else strategy,
                        "nproc": nproc,
                        "kind": kind,
                        **result,
                        **score(kind, result, args.slow_ms, script),
                        "load": os.getloadavg()[0],
                    }
                    totals[kind].append(row)
                    print(json.dumps(row), flush=True)
                    if args.out:
                        with open(args.out, "a") as fh:
                            fh.write(json.dumps(row) + "\n")
    rows = [r for rs in totals.values() for r in rs]
    for kind, rs in totals.items():
        wrong = [r["named"] or "nothing" for r in rs if not r["right"]]
        print(
            f"{kind:<11} {sum(r['right'] for r in rs)}/{len(rs)} right"
            + (f" (named instead: {', '.join(map(str, wrong))})" if wrong else "")
            + f"; place {sum(r['placed'] for r in rs)}/{len(rs)}"
        )
    print(
        f"score: {sum(r['right'] for r in rows)}/{len(rows)} right; {sum(r['placed'] for r in rows)}/{len(rows)} placed"
    )
    print(load())


if __name__ == "__main__":
    main()
