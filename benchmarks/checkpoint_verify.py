"""What verifying a checkpoint against its manifest adds to a resume: a ratio, verify / load.

    .venv/bin/python benchmarks/checkpoint_verify.py [--repeats 5] [--mb 200]

Checkpoints: a synthetic ~200 MB rank-0 file and the same state as DCP shards (one process), and the
gpt workload's own checkpoints written by `trainscale run` (ddp: a rank-0 file; fsdp: shards), at its
default size and widened to ~88 MB (benchmarks/checkpoint_stall.py's size). Per repeat, interleaved:

- load: what a resume reads without any verification (`torch.load(weights_only=True)` of the file;
  `dcp.load` of every shard plus `extra.pt` for a directory);
- verify: the seconds verification added, as the resume logs them (`Found.verified`): for a file,
  the wait for its hash after the load it ran beside (the hash runs on another thread); for a
  directory, hashing every file before DCP loads (one process hashes them all here; N ranks split them).

Median over repeats; ratio = verify / load (goal <= 0.25). Files were just written, so both read
from the page cache: the worst case for the ratio (from a cold disk the read dominates both).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from _common import PYTHON, clean_env, load, run, verdict


def _plain_load(path: Path) -> None:
    import torch

    if path.is_file():
        torch.load(path, weights_only=True)
        return
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.format_utils import _EmptyStateDictLoadPlanner

    from trainscale.checkpoint.dcp_io import SafeReader

    state: dict = {}
    dcp.load(state, storage_reader=SafeReader(path), planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    torch.load(path / "extra.pt", weights_only=True)


def measure(directory: Path, repeats: int) -> tuple[float, float, float]:
    """(median verify s, median load s, checkpoint MiB) for the newest checkpoint in ``directory``."""
    import warnings

    from trainscale.checkpoint import find_latest

    warnings.filterwarnings("ignore", message="torch.distributed is disabled")
    verify, plain = [], []
    for _ in range(repeats):
        found = find_latest(directory)
        verify.append(found.verified.seconds)
        began = time.perf_counter()
        _plain_load(found.path)
        plain.append(time.perf_counter() - began)
    files = [found.path] if found.path.is_file() else [p for p in found.path.rglob("*") if p.is_file()]
    return statistics.median(verify), statistics.median(plain), sum(p.stat().st_size for p in files) / 2**20


def synthetic(root: Path, mb: int) -> dict[str, Path]:
    import torch

    import trainscale
    from trainscale.checkpoint import Checkpointer
    from trainscale.strategies import get_strategy

    n = mb * 2**20 // 4 // 8
    state = {f"w{i}": torch.randn(n) for i in range(8)}
    with trainscale.init(environ={}, set_threads=False) as rt:
        Checkpointer(root / "file", rt).save(1, {"model": state, "step": 1})
        Checkpointer(root / "dcp", rt, strategy=get_strategy("fsdp")).save(1, {"model": state, "step": 1})
    return {f"synthetic {mb} MB, rank-0 file": root / "file", f"synthetic {mb} MB, DCP shards": root / "dcp"}


def gpt(root: Path, strategy: str, width: int) -> Path:
    exp = root / f"gpt-{strategy}-{width}"
    run([PYTHON, "-m", "trainscale", "run", "--nproc-per-node", "1", "--log-dir", str(root / "logs"), "--workload",
         "gpt", "--strategy", strategy, "--max-steps", "2", "--checkpoint-every", "2", "--n-embd", str(width),
         "--seq-len", "32", "--batch-size", "4", "--log-every", "0", "--no-checkpoint-async", "--experiment-dir",
         str(exp)], env=clean_env(), cwd=root, timeout=900)
    return exp / "checkpoints"


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--mb", type=int, default=200)
    a = p.parse_args()
    root = Path(tempfile.mkdtemp(prefix="ts-ckpt-verify-"))
    cases = synthetic(root, a.mb)
    for strategy, kind in (("ddp", "rank-0 file"), ("fsdp", "DCP shards")):
        cases[f"gpt workload (default), {kind}"] = gpt(root, strategy, 128)
        cases[f"gpt workload (--n-embd 384), {kind}"] = gpt(root, strategy, 384)
    worst = 0.0
    for name, directory in cases.items():
        verify, plain, size = measure(directory, a.repeats)
        worst = max(worst, verify / plain)
        print(f"{name:42s} {size:7.1f} MiB  load {plain * 1e3:8.1f} ms  verify {verify * 1e3:7.1f} ms  "
              f"verify / load = {verify / plain:.3f}", flush=True)
    print(f"\nworst ratio verify / load = {worst:.3f}: {verdict(worst, 0.25, higher_is_better=False)}; {load()}")


if __name__ == "__main__":
    main()
