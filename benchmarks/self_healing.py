"""Self-healing benchmark: a node lost at a random step of a 3-node SLURM job, and what it costs.

    TRAINSCALE_TEST_CLUSTER_KEEP=1 .venv/bin/python benchmarks/self_healing.py --trials 8 [--seed 0]

On the 3-node test cluster (tests/slurm/cluster.sh; every node is this machine) each trial submits a job of a
plain user script (DistributedLoader, rt.resume, rt.checkpoint every 3 steps, one epoch, each rank logging the
sample ids of each step) with ``--nodes 2-3`` (continue on fewer), ``-N 2 --spare-nodes 1`` (continue on the
spare) or ``--nodes 1-2`` losing its batch host (``--watch`` requeues the job without it), under ddp or fsdp in turn,
and at a random step of the epoch kills a node the job runs on: its step daemons, slurmd and ranks die and
SLURM marks it down (SlurmCluster.lose_node). Per trial and in total it prints: recovered (the job completed by itself,
the node
named in its output), seconds from the loss to the first step trained again, steps lost (trained after the
newest checkpoint, so trained again), and the exactly-once check: the ids the epoch committed (the first
attempt's steps up to the checkpoint resumed from, then every step after) hold no sample twice and leave out
no sample but the drop_last tail of the shape that ended the epoch.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.cli import wait_for  # noqa: E402
from helpers.slurm_cluster import cluster_session  # noqa: E402

N, BATCH, EVERY = 1440, 8, 3

SCRIPT = """
import os, time
import torch
from torch import nn
import trainscale
from trainscale.data import DistributedLoader

class Ids(torch.utils.data.Dataset):
    def __len__(self):
        return %(n)d
    def __getitem__(self, i):
        return torch.tensor([float(i %% 7), 1.0]), i

with trainscale.init(seed=0) as rt:
    model, optimizer = rt.setup(nn.Sequential(nn.Linear(2, 64), nn.Tanh(), nn.Linear(64, 1)),
                                lambda p: torch.optim.Adam(p, lr=1e-3), strategy=os.environ["STRATEGY"])
    loader = DistributedLoader.for_runtime(Ids(), rt, batch_size=%(batch)d)
    step = rt.resume(model, optimizer, loader=loader)
    log = open(os.path.join(os.environ["TRAINSCALE_RUN_DIR"],
                            f"ids-{os.environ.get('SLURM_RESTART_COUNT', '0')}.\
{os.environ['SLURM_STEP_ID']}-{rt.rank}.txt"), "a")
    while loader.state_dict()["epoch"] < 1:
        for x, ids in loader:
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            time.sleep(0.05)  # a step of a real size: the node dies during the epoch, not after it
            log.write(f"{step} {time.time():.3f} " + " ".join(map(str, ids.tolist())) + "\\n")
            log.flush()
            rt.checkpoint(step, model, optimizer, every=%(every)d, loader=loader)
""" % {"n": N, "batch": BATCH, "every": EVERY}


def attempts(run_dir: Path) -> list[str]:
    """The training attempts, in order: ``RESTART.STEP`` (a requeue restarts SLURM's step ids)."""
    keys = {p.name[len("ids-") :].rsplit("-", 1)[0] for p in run_dir.glob("ids-*-*.txt")}
    return sorted(keys, key=lambda k: tuple(int(x) for x in k.split(".")))


def read_ids(run_dir: Path, attempt: str | None) -> dict[int, list[tuple[int, float, list[int]]]]:
    """rank -> [(step, time, ids)] of one attempt (``RESTART.STEP``) of the job."""
    out: dict[int, list] = {}
    for path in run_dir.glob(f"ids-{attempt}-*.txt") if attempt else ():
        rows = []
        for line in path.read_text().splitlines():
            step, at, *ids = line.split()
            rows.append((int(step), float(at), [int(i) for i in ids]))
        out[int(path.stem.split("-")[-1])] = rows
    return out


SHAPES = {"fewer": ["--nodes", "2-3"], "spare": ["-N", "2", "--spare-nodes", "1"], "host": ["--nodes", "1-2"]}


def trial(cluster, root: Path, index: int, strategy: str, mode: str, rng: random.Random) -> dict:
    work = root / f"trial-{index}"
    work.mkdir()
    (work / "train.py").write_text(SCRIPT)
    argv = [
        sys.executable,
        "-m",
        "trainscale",
        "slurm",
        "--profile",
        "local-test",
        "-t",
        "00:10:00",
        "--launcher",
        "srun",
        "-c",
        "1",
        "--python",
        sys.executable,
        *SHAPES[mode],
        "--env",
        f"STRATEGY={strategy}",
        "--output-dir",
        str(work / "jobs"),
        "--submit",
        "train.py",
    ]
    if mode == "host":  # SLURM keeps a --no-kill job whose batch host is lost: --watch requeues it
        argv[-1:-1] = ["--watch", "--poll", "0.5"]
    watching = subprocess.Popen(
        argv, cwd=work, env={**os.environ, **cluster.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    seen = ""
    while not (m := re.search(r"job (\d+) .*run directory (\S+)", seen)):
        line = watching.stderr.readline()
        assert line, seen + watching.stdout.read()  # ended without submitting
        seen += line
    job, run_dir = m.group(1), Path(m.group(2))
    ranks = 3 if mode == "fewer" else 2
    steps = N // (ranks * BATCH)
    at = rng.randrange(EVERY + 1, int(steps * 0.7))  # a random step of the epoch, after the first checkpoint

    def rank0_steps() -> int:
        found = list(run_dir.glob("ids-0.*-0.txt"))
        return sum(1 for _ in found[0].open()) if found else 0

    wait_for(lambda: rank0_steps() >= at, 300, f"step {at} of job {job}")
    host = cluster.job_fields(job)["BatchHost"]
    nodes = [n for n in ("n1", "n2", "n3") if n != host]
    victim = host if mode == "host" else rng.choice(nodes[:1] if mode == "spare" else nodes)
    lost_at = time.time()
    state = cluster.lose_node_of(job, victim, timeout=600)
    watching.communicate(timeout=120)
    batch = (run_dir / f"{job}.out").read_text()
    keys = attempts(run_dir)
    first, second = read_ids(run_dir, keys[0]), read_ids(run_dir, keys[1] if len(keys) > 1 else None)
    logs = "\n".join(p.read_text() for p in (run_dir / job).glob("*.out"))
    resumed = re.search(r"resumed from \S*ckpt-(\d+)", logs)
    from_step = int(resumed.group(1)) if resumed else 0
    trained_before = max((rows[-1][0] for rows in first.values() if rows), default=0)
    again = min((rows[0][1] for rows in second.values() if rows), default=None)
    committed = collections.Counter(
        i for rows in first.values() for step, _, ids in rows if step <= from_step for i in ids
    )
    committed.update(i for rows in second.values() for _, _, ids in rows for i in ids)
    last_world = len(second) or ranks
    twice = sum(c - 1 for c in committed.values() if c > 1)
    missing = N - len(committed)
    return {
        "strategy": strategy,
        "mode": mode,
        "job": job,
        "state": state,
        "node": victim,
        "at": at,
        "recovered": state == "COMPLETED" and f"node(s) {victim} lost" in batch,
        "seconds": (again - lost_at) if again else None,
        "steps_lost": trained_before - from_step,
        "twice": twice,
        "missing": missing,
        "once": twice == 0 and missing < last_world * BATCH + last_world,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    configs = [(s, mode) for mode in SHAPES for s in ("ddp", "fsdp")]
    results = []
    with cluster_session(3) as cluster, tempfile.TemporaryDirectory(prefix="trainscale-heal-") as tmp:
        for i in range(args.trials):
            strategy, mode = configs[i % len(configs)]
            r = trial(cluster, Path(tmp), i, strategy, mode, rng)
            results.append(r)
            print(
                f"trial {i + 1}: {strategy:4} {mode:5} node {r['node']} lost at step "
                f"{r['at']:3}: {'recovered' if r['recovered'] else 'NOT recovered (' + r['state'] + ')'}, "
                f"training again after {r['seconds']:.1f} s, {r['steps_lost']} step(s) lost, "
                f"{r['twice']} sample(s) twice, {r['missing']} left out: "
                f"{'exactly once' if r['once'] else 'NOT exactly once'}"
                if r["seconds"] is not None
                else f"trial {i + 1}: {strategy} {mode}: no second attempt ({r['state']})",
                flush=True,
            )
    times = [r["seconds"] for r in results if r["seconds"] is not None]
    print(
        f"\ntrials {len(results)}, recovered {sum(r['recovered'] for r in results)}, exactly once "
        f"{sum(r['once'] for r in results)}; from the loss to training again: median "
        f"{statistics.median(times):.1f} s, worst {max(times):.1f} s; steps lost: median "
        f"{statistics.median(r['steps_lost'] for r in results)}, worst {max(r['steps_lost'] for r in results)} "
        f"(checkpoints every {EVERY} steps)"
    )


if __name__ == "__main__":
    main()
