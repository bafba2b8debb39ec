"""``rt.resume``/``rt.checkpoint`` make a plain loop resumable: SLURM's warning signal reaching one rank stops
both ranks at the same step with a checkpoint, and the same command run again finishes with the weights
of a run never interrupted, bitwise (2 gloo ranks through ``trainscale run``)."""

from __future__ import annotations

import re

import pytest

from integration.test_run_cli import trainscale

SCRIPT = '''
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
'''


@pytest.mark.slow
def test_a_signal_stops_every_rank_with_a_checkpoint_and_the_rerun_ends_bitwise_equal(tmp_path):
    for name in ("signalled", "straight"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "train.py").write_text(SCRIPT)
    run = ("run", "--nproc-per-node", "2", "--log-dir", "logs", "train.py")
    stopped = trainscale(*run, "--signal", cwd=tmp_path / "signalled")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    # the ranks agree every 10 steps (TRAINSCALE_PREEMPT_CHECK_EVERY): the signal at step 13 stops them at 20
    assert "preempted (signal on another rank) at step 20: checkpoint saved to checkpoints" in stopped.stdout, \
        stopped.stdout
    assert "not a SLURM job: run the same command again" in stopped.stdout and "FINAL" not in stopped.stdout
    resumed = trainscale(*run, cwd=tmp_path / "signalled")
    straight = trainscale(*run, cwd=tmp_path / "straight")
    for proc in (resumed, straight):
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "resumed from checkpoints/ckpt-00000020.pt" in resumed.stdout and "at step 20" in resumed.stdout, resumed.stdout
    assert "no checkpoint in checkpoints yet: starting at step 0" in straight.stdout
    final = [re.search(r"FINAL (.*)", p.stdout).group(1) for p in (resumed, straight)]
    assert final[0] == final[1], final
