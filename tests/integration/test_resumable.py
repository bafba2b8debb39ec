"""``rt.resume``/``rt.checkpoint`` make a plain loop resumable: SLURM's warning signal reaching one rank stops
both ranks at the same step with a checkpoint, and the same command run again finishes with the weights
of a run never interrupted, bitwise (2 gloo ranks through ``trainscale run``)."""

from __future__ import annotations

import re

import pytest
from integration.test_run_cli import trainscale

SCRIPT = """
import os, signal, sys
import torch
from torch import nn
import trainscale

with trainscale.init(seed=0) as rt:
    model, optimizer = rt.setup(nn.Linear(4, 1), lambda p: torch.optim.SGD(p, lr=0.05), strategy="ddp")
    start = rt.resume(model, optimizer)
    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(rt.rank))
    for step in range(start, 40):
        if step == 13 and start == 0 and "--signal" in sys.argv and rt.rank == 1:
            os.kill(os.getpid(), signal.SIGUSR1)  # what SLURM sends before the time limit (here: to rank 1 only)
        loss = (model(x) - 1).pow(2).mean()
        rt.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        rt.checkpoint(step + 1, model, optimizer, every=5)
    rt.print("FINAL", [v.hex() for v in rt.unwrap(model).weight.detach().double().flatten().tolist()])
"""


@pytest.mark.slow
def test_a_signal_stops_every_rank_with_a_checkpoint_and_the_rerun_ends_bitwise_equal(tmp_path):
    for name in ("signalled", "straight"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.py").write_text(SCRIPT)
    run = ("run", "--nproc-per-node", "2", "--log-dir", "logs", "train.py")
    stopped = trainscale(*run, "--signal", cwd=tmp_path / "signalled")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    # the ranks agree every 10 steps (TRAINSCALE_PREEMPT_CHECK_EVERY): the signal at step 13 stops them at 20
    assert "preempted (signal on another rank) at step 20: checkpoint saved to checkpoints" in stopped.stdout, (
        stopped.stdout
    )
    assert "not a SLURM job: run the same command again" in stopped.stdout and "FINAL" not in stopped.stdout
    resumed = trainscale(*run, cwd=tmp_path / "signalled")
    straight = trainscale(*run, cwd=tmp_path / "straight")
    for proc in (resumed, straight):
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resumed from checkpoints/ckpt-00000020.pt" in resumed.stdout and "at step 20" in resumed.stdout, (
        resumed.stdout
    )
    assert "no checkpoint in checkpoints yet: starting at step 0" in straight.stdout
    final = [re.search(r"FINAL (.*)", p.stdout).group(1) for p in (resumed, straight)]
    assert final[0] == final[1], final


LOADER_SCRIPT = """
import json, os, sys
import torch
from torch import nn
import trainscale
from trainscale.data import DistributedLoader

class Ids(torch.utils.data.Dataset):
    def __len__(self):
        return 256
    def __getitem__(self, i):
        return torch.tensor([float(i)]), i

with trainscale.init(seed=0) as rt:
    model, optimizer = rt.setup(nn.Linear(1, 1), lambda p: torch.optim.SGD(p, lr=1e-3), strategy="ddp")
    loader = DistributedLoader.for_runtime(Ids(), rt, batch_size=4)
    step = start = rt.resume(model, optimizer, loader=loader)
    seen = open(f"seen-rank{rt.rank}.txt", "a")
    while step < 80:  # 32 steps an epoch: 2.5 epochs
        epoch = loader.state_dict()["epoch"]  # the epoch this for loop runs (a resumed one: from mid-epoch)
        for x, ids in loader:
            loss = model(x).pow(2).mean()
            rt.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            seen.write(" ".join(f"{epoch}:{i}" for i in ids.tolist()) + "\\n")
            seen.flush()
            rt.checkpoint(step, model, optimizer, every=10, loader=loader)
            if step == int(os.environ.get("STOP_AT", "0")) and start == 0:
                raise SystemExit(3)  # a crash right after a checkpoint mid-epoch
            if step == 80:
                break
"""


@pytest.mark.slow
def test_a_script_resumed_mid_epoch_trains_every_remaining_sample_once(tmp_path):
    """issue 35 item 1: the loader's checkpoint state is the epoch it is in and the batches of it handed out, not
    the next epoch's start. Stopped at step 20 (mid-epoch 0) and run again: the samples each epoch trained on are
    the uninterrupted run's, none skipped and none repeated (sample-id logs of both ranks)."""
    import collections

    for name in ("stopped", "straight"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.py").write_text(LOADER_SCRIPT)
    run = ("run", "--nproc-per-node", "2", "--log-dir", "logs", "train.py")
    from helpers.cli import in_process

    crashed = in_process(*run, cwd=tmp_path / "stopped", env={"STOP_AT": "20"})
    assert crashed.returncode == 1 and "exit code 3" in crashed.stderr, crashed.stdout + crashed.stderr
    for where in ("stopped", "straight"):
        done = trainscale(*run, cwd=tmp_path / where)
        assert done.returncode == 0, done.stdout + done.stderr

    def per_epoch(where: str) -> dict[str, collections.Counter]:
        counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for rank in (0, 1):
            for line in (tmp_path / where / f"seen-rank{rank}.txt").read_text().split():
                epoch, sample = line.split(":")
                counts[epoch][int(sample)] += 1
        return counts

    stopped, straight = per_epoch("stopped"), per_epoch("straight")
    assert stopped == straight
    assert all(set(c.values()) == {1} for c in straight.values())  # every sample once per epoch
    assert sorted(straight["0"]) == list(range(256))  # the interrupted epoch whole


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_a_run_near_its_time_limit_saves_before_it_without_a_signal(tmp_path):
    """issue 36 item 3: a job's end known (TRAINSCALE_JOB_END, which the batch script reads from squeue) and no
    warning signal at all: the ranks stop together with a checkpoint once the time left would hold no more than
    1.5 of their measured saves and the steps to their next agreement, so the save ends before the limit."""
    import time

    from helpers.cli import in_process

    end = int(time.time()) + 40
    run = (
        "run",
        "--nproc-per-node",
        "2",
        "--log-dir",
        "logs",
        "--workload",
        "cnn",
        "--data",
        "synthetic",
        "--samples",
        "256",
        "--batch-size",
        "16",
        "--log-every",
        "0",
        "--epochs",
        "100000",
        "--checkpoint-every",
        "4",
        "--checkpoint-dir",
        "ckpt",
    )
    stopped = in_process(*run, cwd=tmp_path, env={"TRAINSCALE_JOB_END": str(end)})
    said = stopped.stdout + stopped.stderr
    assert "Preempted (the time limit in " in said and ", a save takes " in said, said[-3000:]
    step = int(re.search(r"Preempted .* at step (\d+)", said).group(1))
    last = tmp_path / "ckpt" / f"ckpt-{step:08d}.pt"
    assert last.exists() and last.stat().st_mtime < end, "the last save did not end before the limit"
