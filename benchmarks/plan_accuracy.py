"""Plan accuracy: what `trainscale plan` predicts against what the runs then measure.

    TRAINSCALE_TEST_CLUSTER_KEEP=1 .venv/bin/python benchmarks/plan_accuracy.py [--steps 10] [--caps 20]
        [--repeats 3] [--seed 0] [--no-slurm] [--out plan-accuracy.json]
    .venv/bin/python benchmarks/plan_accuracy.py --from plan-accuracy.json[,more.json]   # the tables, today's model

Part 1, the matrix. For the workloads cnn, vit and gpt, a course-style DDP script (torchrun's variables,
DistributedSampler, DDP, no trainscale import) and README's train.py (``--targets ...,readme``), `plan`'s own
calibration (one rank, --steps optimizer steps,
plan/calibrate.py; for a workload also FSDP's own, over a group of one) and its all-reduce sweeps here (among 2
and 4 ranks: gloo's, and trainscale's shared-memory average for the workloads' ddp) make the plan, exactly as
`trainscale plan` does (its default network, this machine's cores).
Then each configuration runs for the same steps: 1 rank; 2 ranks here under ddp, zero1 and fsdp (the script: its
own DDP); 4 ranks as 2 nodes x 2 on the SLURM test cluster (tests/slurm/cluster.sh; its nodes are this machine, so
the 4 ranks, one thread each, share its cores and are predicted as such). As `plan` does for 2 ranks here, the
calibration (and the 1-rank configuration) runs on the threads each of 2 ranks gets. Per configuration: the
predicted and measured held bytes (parameters, gradients, optimizer state of the fullest rank: the run's memory
table, a script's state count), peak memory over the training steps (process RSS: the largest rank's) and median
step after the warm-up. Every configuration runs --repeats times (3), in passes over all of them; its row is the
repeat with the median step of the undisturbed ones. The plan is made once, from one calibration, as a user
gets it. A configuration counts as disturbed when the machine's CPUs were more than 10% busy in the
second before it started (other work: what no model of the training predicts), or when this machine's own speed
(a fixed piece of one-thread work, timed before and after the run) differed from its calibration's by more than
10% (a shared host's neighbours: no plan from that calibration can know); the step-time figure leaves those out,
as the studies do, and gives the figure with them too.

Part 2, memory caps. --caps configurations, each a target and per-rank batch drawn at random: `plan`'s
calibration here, uncapped, at that batch; a cap drawn between 0.5x and 2x of its predicted peak; the plan's
verdict for a node of that memory (`plan --mem`: yes, tight, NO); then the same run in a memory cgroup of that
size (cgroup v1 memory.limit_in_bytes or v2 memory.max; no swap here), its training steps only (the
calibration's stop, before the workload's end-of-epoch evaluation, which the plan says it does not count).
Right: predicted within the room (yes or tight) and it ran, or NO and the kernel killed it for memory.

Needs root (the cgroup, the SLURM test cluster). Prints the tables as they go into docs/scaling.md; writes every
calibration's and run's records to --out, from which --from recomputes the tables with the current model.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "src"))

from helpers.readme import readme_train_script  # noqa: E402

from trainscale.errors import ConfigError  # noqa: E402
from trainscale.plan.calibrate import (  # noqa: E402
    OWN_CALIBRATIONS,
    compare,
    network,
    setup_args,
    short_run,
    steps_peaks,
    sweep_hooks,
)
from trainscale.plan.comm import Sweep  # noqa: E402
from trainscale.plan.model import Calibration, make_plan, memory  # noqa: E402
from trainscale.plan.text import verified_table  # noqa: E402

STRATEGIES = ("ddp", "zero1", "fsdp")
WORKLOADS = ("cnn", "vit", "gpt")
QUIET = 0.10
"""Share of the machine's CPUs busy in the second before a run above which it counts as disturbed."""
PACE = 0.10
"""A run also counts as disturbed when this machine's own speed (:func:`pace`, before and after it) differed
from its calibration's by more than this: what a plan made from that calibration cannot know."""


def paced(calibration: dict, run: dict) -> float:
    """The largest relative difference between the run's pace (before, after) and its calibration's (their
    mean); 0 where not measured."""
    if not calibration.get("pace") or not run.get("pace"):
        return 0.0
    ref = statistics.mean(calibration["pace"])
    return max(abs(p / ref - 1) for p in run["pace"])


SCRIPT = '''
"""Course-style DDP: torchrun's variables, DistributedSampler, DDP, Adam; no trainscale import."""
import argparse, os
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--epochs", type=int, default=1000)
args = parser.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(),
                          nn.AdaptiveAvgPool2d(8), nn.Flatten(), nn.Linear(64 * 64, 256), nn.ReLU(),
                          nn.Linear(256, 10)))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
data = TensorDataset(torch.randn(2048, 3, 32, 32), torch.randint(0, 10, (2048,)))
sampler = DistributedSampler(data)
loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for x, y in loader:
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
dist.destroy_process_group()
'''

CAPPED = '''
"""Joins the memory cgroup PLAN_BENCH_CGROUP names (before torch is imported), then runs its first argument:
a script, or -m MODULE."""
import os, runpy, sys

cgroup = os.environ.get("PLAN_BENCH_CGROUP")
if cgroup:
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as procs:
        procs.write(str(os.getpid()))
if sys.argv[1] == "-m":
    sys.argv = sys.argv[2:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
else:
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
'''


def busy_share(seconds: float = 1.0) -> float:
    """The share of this machine's CPUs busy over ``seconds`` (/proc/stat)."""

    def read() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + fields[4]
        return sum(fields) - idle, sum(fields)

    busy0, total0 = read()
    time.sleep(seconds)
    busy1, total1 = read()
    return (busy1 - busy0) / max(1, total1 - total0)


def pace() -> float:
    """Seconds per round of a fixed piece of CPU work on one thread (a 256x256 matmul and a small convolution):
    this machine's own speed, which a shared host's neighbours change between one run and the next."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    a, x, conv = torch.randn(256, 256), torch.randn(64, 3, 32, 32), torch.nn.Conv2d(3, 32, 3, padding=1)
    with torch.no_grad():
        for _ in range(3):
            a @ a, conv(x)
        start = time.perf_counter()
        for _ in range(40):
            a @ a, conv(x).sum()
        took = (time.perf_counter() - start) / 40
    torch.set_num_threads(threads)
    return took


def say(line: str) -> None:
    print(f"  {line}", file=sys.stderr, flush=True)


SCRIPTS = {"script": "course_ddp.py", "readme": "train.py"}
"""The targets that are scripts: the course-style one (its batch an option) and README's train.py (batch 16)."""


def script_args(target: str, batch: int | None) -> tuple[str, ...]:
    return ("--batch-size", str(batch or 32)) if target == "script" else ()


def target_args(target: str, work: Path, batch: int | None) -> dict:
    """short_run's target: a workload, or a script with its batch."""
    if target in SCRIPTS:
        return {"script": str(work / SCRIPTS[target]), "workload": None, "args": script_args(target, batch)}
    return {"script": None, "workload": target, "args": ()}


def measure(
    target: str,
    work: Path,
    steps: int,
    *,
    ranks: int,
    strategy: str | None,
    batch: int | None,
    threads: int | None = None,
    alone: bool = False,
) -> dict:
    quiet, before = busy_share(), pace()
    what = target_args(target, work, batch)
    records, metrics, peaks, _ = short_run(
        script=what["script"],
        args=what["args"],
        workload=what["workload"],
        batch=batch if what["workload"] else None,
        steps=steps,
        say=say,
        nproc=ranks,
        strategy=strategy,
        threads=threads,
        alone=alone,
    )
    return {"records": records, "metrics": metrics, "peaks": peaks, "busy_before": quiet, "pace": [before, pace()]}


def measure_slurm(
    cluster, target: str, work: Path, steps: int, *, strategy: str | None, batch: int, name: str = ""
) -> dict:
    """2 nodes x 2 ranks on the test cluster, stopped after ``steps`` optimizer steps like the calibration."""
    from trainscale.workloads.registry import get_workload

    quiet, before = busy_share(), pace()
    out = work / f"slurm-{target}-{strategy}{name and '-' + name}"
    out.mkdir()
    metrics = out / "metrics.json"  # the same file for both attempts: the second overwrites the first's
    if target in SCRIPTS:
        tail = ["--env", f"TRAINSCALE_PLAN_STEPS={steps}", str(work / SCRIPTS[target]), *script_args(target, batch)]
    else:
        tail = [
            "--workload",
            target,
            "--strategy",
            strategy,
            *get_workload(target).batch_args(batch, 4),
            "--epochs",
            "1000",
            "--log-every",
            "0",
            "--max-steps",
            str(steps + 1),
            "--metrics-out",
            str(metrics),
        ]
    argv = [
        sys.executable,
        "-m",
        "trainscale",
        "slurm",
        "--profile",
        "local-test",
        "-N",
        "2",
        "--gpus-per-node",
        "2",
        "-t",
        "00:10:00",
        "--python",
        sys.executable,
        "--output-dir",
        str(out / "jobs"),
        "--env",
        "TRAINSCALE_RECORD=1",
        "--env",
        "TRAINSCALE_HANG_NOTICE=0",
        "--env",
        "OMP_NUM_THREADS=1",
        "--submit",
        "--watch",
        "--poll",
        "0.5",
        "--watch-timeout",
        "600",
        *tail,
    ]
    say(f"2 nodes x 2 on the test cluster: {target} {strategy or '(its own DDP)'}")
    # each job in a directory of its own: a workload resumes from the checkpoints it finds in its working directory
    for attempt in (1, 2):  # a failed job is said, kept (its logs) and submitted once more
        done = subprocess.run(
            [
                *argv[: argv.index("--output-dir") + 1],
                str(out / f"jobs-{attempt}"),
                *argv[argv.index("--output-dir") + 2 :],
            ],
            cwd=out,
            env={**os.environ, **cluster.env},
            capture_output=True,
            text=True,
            timeout=900,
        )
        found = re.search(r"run directory (\S+)", done.stderr + done.stdout)
        if done.returncode == 0 and found:
            break
        print(
            f"  the SLURM run failed (exit {done.returncode}), kept in {out}:\n{(done.stdout + done.stderr)[-1500:]}",
            file=sys.stderr,
            flush=True,
        )
    else:
        raise ConfigError(f"the SLURM run failed twice: {out}")
    run_dir = Path(found.group(1))
    files = sorted(run_dir.glob("metrics/rank-*.jsonl"))
    records = [json.loads(x) for x in files[0].read_text().splitlines() if x.strip()]
    peaks = steps_peaks(run_dir / "metrics")
    return {
        "records": records,
        "metrics": json.loads(metrics.read_text()) if metrics.exists() else None,
        "peaks": peaks,
        "busy_before": quiet,
        "pace": [before, pace()],
    }


def _save(path: str, **parts) -> None:
    """What is measured so far, so that a failure later loses none of it (--from reads a partial file)."""
    Path(path).write_text(json.dumps({"caps": [], **parts}))


def matrix(targets: list[str], work: Path, steps: int, slurm: bool, save, repeats: int = 1) -> list[dict]:
    """Part 1's raw measurements: each target's calibration and its configurations' runs, every configuration
    ``repeats`` times, one pass over them after another (a slow spell of the machine then costs one repeat of
    several configurations, not every repeat of one)."""
    import contextlib

    from helpers.slurm_cluster import cluster_session

    out = []
    with cluster_session(2) if slurm else contextlib.nullcontext() as cluster:
        for target in targets:
            print(f"{target}:", file=sys.stderr, flush=True)
            # plan's calibration for 2 ranks here: one rank on the threads each of the 2 gets
            threads = max(1, (os.cpu_count() or 1) // 2)
            cal = measure(target, work, steps, ranks=1, strategy=None, batch=None, threads=threads)
            batch = Calibration.from_records(cal["records"]).batch
            own = (
                {
                    name: measure(target, work, steps, ranks=1, strategy=spec, batch=batch, threads=threads)
                    for name, spec in OWN_CALIBRATIONS.items()
                }
                if target not in SCRIPTS
                else {}
            )
            calibrated = Calibration.from_records(cal["records"])
            if target in SCRIPTS and calibrated.setup and calibrated.strategy in (None, "none"):
                # as plan does for a script whose rt.setup wraps nothing on one rank: its strategy alone too
                own[calibrated.modelled_strategy()] = measure(
                    target, work, steps, ranks=1, strategy=None, batch=batch, threads=threads, alone=True
                )
            runs = []
            for repeat in range(repeats):
                runs.append(
                    {
                        "ranks": 1,
                        "nodes": 1,
                        "strategy": None,
                        "repeat": repeat,
                        **measure(target, work, steps, ranks=1, strategy=None, batch=batch, threads=threads),
                    }
                )
                for strategy in STRATEGIES if target not in SCRIPTS else (None,):
                    runs.append(
                        {
                            "ranks": 2,
                            "nodes": 1,
                            "strategy": strategy,
                            "repeat": repeat,
                            **measure(target, work, steps, ranks=2, strategy=strategy, batch=batch),
                        }
                    )
                    if slurm:
                        runs.append(
                            {
                                "ranks": 4,
                                "nodes": 2,
                                "strategy": strategy,
                                "repeat": repeat,
                                **measure_slurm(
                                    cluster, target, work, steps, strategy=strategy, batch=batch, name=f"{repeat}"
                                ),
                            }
                        )
            out.append({"target": target, "batch": batch, "calibration": cal, "own": own, "runs": runs})
            save(out)
    return out


def sweeps(ranks: int) -> list[dict]:
    """plan's all-reduce sweeps here, as `trainscale plan --nproc-per-node 4` (a workload) measures them: among 2
    and 4 ranks, gloo's and trainscale's shared-memory average (the test cluster's 2 x 2 are this machine's 4)."""
    from dataclasses import asdict

    from trainscale.plan.calibrate import sweeps_here

    return [asdict(w) for w in sweeps_here(ranks, say, ("none", "shm"))]


def listed(found: list | dict) -> list[dict]:
    """A file's sweeps (an older file keyed them by ranks and hook)."""
    return list(found.values()) if isinstance(found, dict) else found


def swept(raw: list[dict]) -> list[Sweep]:
    """The sweeps a file holds (an older file: the all-reduce results themselves)."""
    return [
        Sweep.from_result(r) if "rows" in r else Sweep(**{**r, "points": tuple(map(tuple, r["points"]))})
        for r in raw
        if "error" not in r
    ]


def cgroup_dir(name: str) -> tuple[Path, str]:
    """A new memory cgroup (v2 when the unified hierarchy has the memory controller, else v1) and its limit file."""
    v2 = Path("/sys/fs/cgroup")
    if (v2 / "cgroup.controllers").exists() and "memory" in (v2 / "cgroup.controllers").read_text().split():
        path = v2 / name
        path.mkdir(exist_ok=True)
        return path, "memory.max"
    path = v2 / "memory" / name
    path.mkdir(exist_ok=True)
    return path, "memory.limit_in_bytes"


def capped(targets: list[str], work: Path, count: int, rng: random.Random) -> list[dict]:
    """Part 2's raw measurements: per configuration its calibration, cap and what happened under it."""
    batches = {
        "cnn": (16, 64, 256, 1024),
        "vit": (8, 32, 128, 256),
        "gpt": (4, 8, 16, 32),
        "script": (16, 64, 256, 512),
    }
    out = []
    wrapper = work / "capped.py"
    for i in range(count):
        target = targets[i % len(targets)]
        batch = rng.choice(batches[target])
        args = (
            ("-m", "trainscale.workloads", target, "--epochs", "1000", "--log-every", "0", *_batch_args(target, batch))
            if target not in SCRIPTS
            else (str(work / "course_ddp.py"), "--batch-size", str(batch))
        )
        print(f"cap {i + 1}/{count}: {target} batch {batch}", file=sys.stderr, flush=True)
        records, _, _, _ = short_run(script=str(wrapper), args=args, workload=None, batch=None, steps=3, say=say)
        cal = Calibration.from_records(records)
        peak = memory(cal, "ddp", 1, batch).peak
        cap = int(peak * rng.uniform(0.5, 2.0))
        path, limit = cgroup_dir(f"trainscale-plan-bench-{os.getpid()}-{i}")
        (path / limit).write_text(str(cap))
        os.environ["PLAN_BENCH_CGROUP"] = str(path)
        try:
            short_run(script=str(wrapper), args=args, workload=None, batch=None, steps=3, say=say)
            outcome, why = "ran", ""
        except ConfigError as exc:
            hit = _cgroup_hit(path)
            outcome, why = ("killed for memory" if hit else "failed"), exc.message.splitlines()[-1]
        finally:
            os.environ.pop("PLAN_BENCH_CGROUP")
            _remove(path)
        out.append({"target": target, "batch": batch, "cap": cap, "records": records, "outcome": outcome, "why": why})
    return out


def _batch_args(target: str, batch: int) -> list[str]:
    from trainscale.workloads.registry import get_workload

    return get_workload(target).batch_args(batch, 1)


def _cgroup_hit(path: Path) -> bool:
    """Whether the cgroup's limit was reached (v1 failcnt, v2 memory.events' max or oom_kill)."""
    if (path / "memory.failcnt").exists():
        return int((path / "memory.failcnt").read_text()) > 0
    events = dict(line.split() for line in (path / "memory.events").read_text().splitlines())
    return int(events.get("oom_kill", 0)) > 0 or int(events.get("max", 0)) > 0


def _remove(path: Path) -> None:
    for _ in range(50):  # the killed processes leave the cgroup as they are reaped
        try:
            path.rmdir()
            return
        except OSError:
            time.sleep(0.1)


# -- the tables, from the raw measurements -----------------------------------------------------------------------


def analyse_matrix(raw: list[dict], measured: list[dict]) -> list[dict]:
    rows = []
    net, net_source = network(None, None)
    cores = os.cpu_count() or 1
    sweeps_here = swept(measured)
    for entry in raw:
        cal = Calibration.from_records(entry["calibration"]["records"])
        own = {name: Calibration.from_records(run["records"]) for name, run in entry.get("own", {}).items()}
        if entry["target"] in SCRIPTS:  # a script's strategy alone: its pace, the plain calibration's peak (plan's)
            own = {name: replace(c, peak=cal.peak, reserve=cal.reserve) for name, c in own.items()}
        # as plan measures them: a script's own DDP all-reduces with gloo, trainscale's ddp (a workload's, or a
        # script's rt.setup) on one machine's CPUs with shared memory (the test cluster's 2 nodes are this machine)
        hooks = sweep_hooks(setup_args(cal), None) if entry["target"] in SCRIPTS else ("none", "shm")
        plan = make_plan(
            cal,
            what=entry["target"],
            ranks_per_node=2,
            nodes=1,
            batch=entry["batch"],
            device_bytes=None,
            device_source="-",
            network=net,
            network_source=net_source,
            shared_cores=cores,
            own=own,
            sweeps=[w for w in sweeps_here if w.hook in hooks],
        )
        configs: dict[tuple, list[dict]] = {}
        for run in entry["runs"]:
            # the test cluster's nodes are this machine: its ranks share its cores, predicted as one node's
            row = compare(
                plan,
                run["records"],
                run["metrics"],
                run["peaks"],
                ranks=run["ranks"],
                nodes=1,
                strategy=run["strategy"],
            )
            where = (
                f"{run['nodes']} nodes x {run['ranks'] // run['nodes']}"
                if run["nodes"] > 1
                else f"{run['ranks']} rank(s)"
            )
            row["config"] = f"{entry['target']}, {where}, {run['strategy'] or cal.modelled_strategy()}"
            busy, pace_off = run["busy_before"], paced(entry["calibration"], run)
            row["disturbed"] = (  # the reason, as plan --verify says it (empty: undisturbed)
                f"the CPUs were {busy:.0%} busy in the second before it"
                if busy > QUIET
                else f"this machine's pace differed {pace_off:.0%} from the calibration's"
                if pace_off > PACE
                else ""
            )
            configs.setdefault((run["ranks"], run["nodes"], run["strategy"]), []).append(row)
        rows += [representative(repeats) for repeats in configs.values()]
    return rows


def representative(repeats: list[dict]) -> dict:
    """A configuration measured several times: the repeat whose step is the median of the undisturbed ones (of
    all of them when every one was disturbed), with how many there were."""
    kept = [r for r in repeats if not r["disturbed"]] or repeats
    kept = sorted(kept, key=lambda r: r["measured_step_s"])
    row = dict(kept[(len(kept) - 1) // 2])
    if len(repeats) > 1:
        row["config"] += f" (median of {len(kept)}/{len(repeats)})"
    return row


def analyse_caps(raw: list[dict]) -> list[dict]:
    rows = []
    net, net_source = network(None, None)
    for entry in raw:
        cal = Calibration.from_records(entry["records"])
        plan = make_plan(
            cal,
            what=entry["target"],
            ranks_per_node=1,
            nodes=1,
            batch=entry["batch"],
            device_bytes=float(entry["cap"]),
            device_source="cap",
            network=net,
            network_source=net_source,
        )
        m = memory(cal, "ddp", 1, entry["batch"])
        verdict = plan.verdict(m)
        ran = entry["outcome"] == "ran"
        right = None if entry["outcome"] == "failed" else (verdict in ("yes", "tight")) == ran
        rows.append(
            {
                "target": entry["target"],
                "batch": entry["batch"],
                "cap": entry["cap"],
                "peak": m.peak,
                "verdict": verdict,
                "outcome": entry["outcome"],
                "right": right,
            }
        )
    return rows


def report(matrix_rows: list[dict], cap_rows: list[dict]) -> None:
    if matrix_rows:
        print(f"\nPredicted against measured ({len(matrix_rows)} configurations; error = measured / predicted - 1):")
        print("\n".join(verified_table(matrix_rows)))
        held = [abs(v["held_error"]) for v in matrix_rows if v["held_error"] is not None]
        peak = [abs(v["peak_error"]) for v in matrix_rows if v["peak_error"] is not None]
        said = [v for v in matrix_rows if v["step_error"] is not None and not v.get("uncertain")]
        quiet = [abs(v["step_error"]) for v in said if not v["disturbed"]]
        every = [abs(v["step_error"]) for v in said]
        uncertain = [
            f"{v['config']} (had it said a number: {v['step_error']:+.1%})" for v in matrix_rows if v.get("uncertain")
        ]
        print(
            f"\nheld bytes within 2%: {sum(e <= 0.02 for e in held)}/{len(held)} (largest |error| "
            f"{max(held, default=0):.1%}); peak within 15%: {sum(e <= 0.15 for e in peak)}/{len(peak)} (largest "
            f"{max(peak, default=0):.1%}); step time within 15%: {sum(e <= 0.15 for e in quiet)}/{len(quiet)} "
            f"undisturbed, within 25%: {sum(e <= 0.25 for e in quiet)}/{len(quiet)} (median |error| "
            f"{statistics.median(quiet) if quiet else 0:.1%}; {sum(bool(v['disturbed']) for v in said)} disturbed "
            f"left out; with them {sum(e <= 0.15 for e in every)}/{len(every)} within 15%); said too uncertain "
            f"instead of a number: {len(uncertain)}" + (f": {'; '.join(uncertain)}" if uncertain else "")
        )
    if cap_rows:
        print(f"\nUnder a memory cap ({len(cap_rows)} configurations, 1 rank; verdict for a node of the cap's size):")
        print(f"{'target':<7} {'batch':>5} {'cap MiB':>8} {'peak MiB':>9} {'verdict':<7} {'outcome':<18} right")
        for r in cap_rows:
            print(
                f"{r['target']:<7} {r['batch']:>5} {r['cap'] / 2**20:>8.0f} {r['peak'] / 2**20:>9.0f} "
                f"{r['verdict']:<7} {r['outcome']:<18} {'-' if r['right'] is None else 'yes' if r['right'] else 'NO'}"
            )
        judged = [r for r in cap_rows if r["right"] is not None]
        print(
            f"verdict right: {sum(r['right'] for r in judged)}/{len(judged)} "
            f"({sum(r['verdict'] == 'tight' for r in cap_rows)} tight)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--caps", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--targets", default="cnn,vit,gpt,script,readme")
    parser.add_argument("--no-slurm", action="store_true", help="leave out the 2 x 2 runs on the test cluster")
    parser.add_argument("--no-matrix", action="store_true")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every configuration (their median)")
    parser.add_argument("--out", default="plan-accuracy.json")
    parser.add_argument("--from", dest="source", help="recompute the tables from files --out wrote (A,B,...)")
    args = parser.parse_args()
    if args.source:  # several files (a matrix measured in parts, the caps apart): their measurements together
        parts = [json.loads(Path(path).read_text()) for path in args.source.split(",")]
        raw = {
            "matrix": [m for part in parts for m in part.get("matrix", [])],
            "caps": [c for part in parts for c in part.get("caps", [])],
            "sweeps": [w for part in parts for w in listed(part.get("sweeps") or [])],
        }
    else:
        targets = args.targets.split(",")
        work = Path(tempfile.mkdtemp(prefix="trainscale-plan-bench-"))  # kept when something fails: its logs
        (work / "course_ddp.py").write_text(SCRIPT)
        (work / "train.py").write_text(readme_train_script())
        (work / "capped.py").write_text(CAPPED)
        t0 = time.monotonic()
        measured = [] if args.no_matrix else sweeps(4 if not args.no_slurm else 2)
        raw = {
            "steps": args.steps,
            "cores": os.cpu_count(),
            "started": time.strftime("%Y-%m-%d %H:%M"),
            "sweeps": measured,
            "matrix": []
            if args.no_matrix
            else matrix(
                targets,
                work,
                args.steps,
                not args.no_slurm,
                save=lambda part: _save(args.out, matrix=part, sweeps=measured),
                repeats=args.repeats,
            ),
            "caps": capped(targets, work, args.caps, random.Random(args.seed)) if args.caps else [],
        }
        raw["seconds"] = time.monotonic() - t0
        Path(args.out).write_text(json.dumps(raw))
        shutil.rmtree(work)
        print(f"measured in {raw['seconds']:.0f} s; raw records in {args.out}", file=sys.stderr)
    report(analyse_matrix(raw["matrix"], raw.get("sweeps", [])), analyse_caps(raw["caps"]))


if __name__ == "__main__":
    main()
