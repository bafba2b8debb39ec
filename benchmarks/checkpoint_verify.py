"""What verifying a checkpoint against its manifest adds to a resume: a ratio, added / load.

    .venv/bin/python benchmarks/checkpoint_verify.py [--repeats 5] [--mb 200]

Checkpoints: a synthetic ~200 MB rank-0 file and the same state as DCP shards (one process), and the
gpt workload's own checkpoints written by `trainscale run` (ddp: a rank-0 file; fsdp: shards), at its
default size and widened to ~84 MB (benchmarks/checkpoint_stall.py's width). Per repeat, interleaved:

- load: what a resume reads without any verification (`torch.load(weights_only=True)` of the file;
  `dcp.load` of every shard plus `extra.pt` for a directory);
- verified: the same through trainscale's resume path (`find_latest`, then `dcp.load` for shards):
  a .pt is hashed on other threads beside its load; shards are hashed (on every core) before DCP
  loads them, as the ranks must agree before any loads (one process hashes all of them here; N
  ranks split them);
- hashing: the hashing's own time, as the resume logs it (`Found.verified`);
- cpu: the same two paths in CPU seconds of this process (every thread): the work verifying adds,
  which oversubscribed cores do not distort the way they distort wall time.

Each load runs in a fresh process, as a resume does (fresh memory: page faults are part of a load),
the two alternating which goes first. Best of the repeats for each (the least disturbed run: on a
shared machine other processes only ever add time); ratio = (verified - load) / load (goal <= 0.25).
Files were just written, so both read from the page cache: the worst case for the ratio (from a
cold disk the read dominates both).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from _common import PYTHON, clean_env, load, run, verdict


def _dcp_load(path: Path) -> dict:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner

    from trainscale.checkpoint.dcp_io import SafeReader

    state: dict = {}
    dcp.load(state, storage_reader=SafeReader(path), planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    return state


def child(directory: Path, how: str) -> None:
    """One resume's load, in a fresh process as a resume is (fresh memory, nothing warmed up): prints
    {"wall", "cpu", "hashing"} as JSON."""
    import json
    import warnings

    import torch

    from trainscale.checkpoint import find_latest, list_checkpoints

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    path, hashing = list_checkpoints(directory)[0][1], 0.0
    began, cpu = time.perf_counter(), time.process_time()
    if how == "verified":
        found = find_latest(directory)
        kept = (found, _dcp_load(found.path) if found.path.is_dir() else None)
        hashing = found.verified.seconds
    elif path.is_file():
        kept = torch.load(path, weights_only=True)
    else:
        kept = (_dcp_load(path), torch.load(path / "extra.pt", weights_only=True))
    print(json.dumps({"wall": time.perf_counter() - began, "cpu": time.process_time() - cpu, "hashing": hashing}))
    del kept


def measure(directory: Path, repeats: int) -> dict[str, float]:
    """Best-of-``repeats`` seconds (wall, CPU) of a plain load and a verified one, each in a fresh
    process, alternating which goes first; the hashing's own time; the checkpoint's size."""
    import json

    from trainscale.checkpoint import list_checkpoints

    got: dict[str, list[dict]] = {"plain": [], "verified": []}
    for k in range(repeats):
        for how in ("verified", "plain") if k % 2 else ("plain", "verified"):
            _, out = run([PYTHON, __file__, "--child", str(directory), how], env=clean_env(), timeout=600)
            got[how].append(json.loads(out.strip().splitlines()[-1]))
    path = list_checkpoints(directory)[0][1]
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    best = {how: {key: min(r[key] for r in runs) for key in ("wall", "cpu", "hashing")} for how, runs in got.items()}
    return {
        "load": best["plain"]["wall"],
        "verified": best["verified"]["wall"],
        "hashing": best["verified"]["hashing"],
        "cpu_load": best["plain"]["cpu"],
        "cpu_verified": best["verified"]["cpu"],
        "mib": sum(p.stat().st_size for p in files) / 2**20,
    }


def synthetic(root: Path, mb: int) -> dict[str, Path]:
    import torch

    import trainscale
    from trainscale.checkpoint import Checkpointer, ModelState
    from trainscale.checkpoint.state import DCP
    from trainscale.strategies import get_strategy

    class Shards(ModelState):  # the same tensors, kept as DCP shards as FSDP keeps its state
        storage = DCP

        def state_dict(self) -> dict:
            return {"model": state}

        def load_state_dict(self, state_dict: dict) -> None:
            raise NotImplementedError

    n = mb * 2**20 // 4 // 8
    state = {f"w{i}": torch.randn(n) for i in range(8)}
    with trainscale.init(environ={}, set_threads=False) as rt:
        Checkpointer(root / "file", rt).save(1, {"model": state, "step": 1})
        Checkpointer(root / "dcp", rt, strategy=get_strategy("fsdp")).save(1, {"model": Shards(), "step": 1})
    return {f"synthetic {mb} MB, rank-0 file": root / "file", f"synthetic {mb} MB, DCP shards": root / "dcp"}


def gpt(root: Path, strategy: str, width: int) -> Path:
    exp = root / f"gpt-{strategy}-{width}"
    run(
        [
            PYTHON,
            "-m",
            "trainscale",
            "run",
            "--nproc-per-node",
            "1",
            "--log-dir",
            str(root / "logs"),
            "--workload",
            "gpt",
            "--strategy",
            strategy,
            "--max-steps",
            "2",
            "--checkpoint-every",
            "2",
            "--n-embd",
            str(width),
            "--seq-len",
            "32",
            "--batch-size",
            "4",
            "--log-every",
            "0",
            "--no-checkpoint-async",
            "--experiment-dir",
            str(exp),
        ],
        env=clean_env(),
        cwd=root,
        timeout=900,
    )
    return exp / "checkpoints"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--mb", type=int, default=200)
    p.add_argument("--child", nargs=2, metavar=("DIR", "HOW"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        return child(Path(a.child[0]), a.child[1])
    root = Path(tempfile.mkdtemp(prefix="ts-ckpt-verify-"))
    try:
        report(root, a)
    finally:
        shutil.rmtree(root, ignore_errors=True)  # ~0.7 GB of checkpoints


def report(root: Path, a: argparse.Namespace) -> None:
    cases = synthetic(root, a.mb)
    for strategy, kind in (("ddp", "rank-0 file"), ("fsdp", "DCP shards")):
        cases[f"gpt workload (default), {kind}"] = gpt(root, strategy, 128)
        cases[f"gpt workload (--n-embd 384), {kind}"] = gpt(root, strategy, 384)
    worst = 0.0
    for name, directory in cases.items():
        m = measure(directory, a.repeats)
        ratio = max(0.0, m["verified"] - m["load"]) / m["load"]
        cpu = max(0.0, m["cpu_verified"] - m["cpu_load"]) / m["cpu_load"]
        worst = max(worst, ratio)
        print(
            f"{name:40s} {m['mib']:6.1f} MiB  wall: load {m['load'] * 1e3:7.1f} ms, verified "
            f"{m['verified'] * 1e3:7.1f} ms (hashing {m['hashing'] * 1e3:6.1f} ms), added / load {ratio:.3f};  "
            f"cpu: load {m['cpu_load'] * 1e3:7.1f} ms, added / load {cpu:.3f}",
            flush=True,
        )
    from trainscale.checkpoint.integrity import default_threads

    print(
        f"\nworst ratio added / load = {worst:.3f}: {verdict(worst, 0.25, higher_is_better=False)}; "
        f"{default_threads()} hashing thread(s); {load()}"
    )


if __name__ == "__main__":
    main()
