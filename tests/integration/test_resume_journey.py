"""Runs never silently reuse state: one checkpoint directory met by the commands a user types in
order (README's strategy list). A resume says where from (and from which strategy: ddp, zero1 and fsdp resume
each other); a run that would train nothing is refused naming the way out; ``--fresh`` starts anew and keeps
the old checkpoints."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch import nn

from trainscale.errors import CheckpointError

SAMPLES, WIDTH = 64, 8


def train(directory, capsys=None, **options) -> dict:
    import trainscale
    from trainscale.data import DeviceTensorLoader
    from trainscale.strategies.base import OptimizerSpec
    from trainscale.train import Loop, Task, TrainOptions

    g = torch.Generator().manual_seed(2)
    x, y = torch.randn(SAMPLES, WIDTH, generator=g), torch.randint(0, 3, (SAMPLES,), generator=g)
    with trainscale.init(seed=0, set_threads=False) as rt:
        loader = DeviceTensorLoader.for_runtime(x, y, runtime=rt, batch_size=8, shuffle=False)
        task = Task(
            name="mlp",
            loader=loader,
            samples=SAMPLES,
            loss=lambda model, batch: nn.functional.cross_entropy(model(batch[0]), batch[1]),
            model=lambda: nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 3)),
            optimizer=OptimizerSpec(torch.optim.SGD, {"lr": 0.5}),
        )
        opts = TrainOptions(**{"epochs": 1, "batch_size": 8, "checkpoint_dir": str(directory), **options})
        return Loop(rt, opts, task).run()


def test_a_checkpoint_directory_met_by_commands_in_order(tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    assert train(ckpt, max_steps=4)["steps"] == 4

    # the next command of README's list: another strategy on the same directory resumes it, and says so
    capsys.readouterr()
    assert train(ckpt, max_steps=5, strategy="zero1")["steps"] == 5
    assert "at step 4" in (said := capsys.readouterr().out) and "by strategy ddp, now zero1" in said, said

    # a shorter run on a directory past its end: nothing to train is an error, not a success
    with pytest.raises(CheckpointError) as nothing:
        train(ckpt, max_steps=2)
    assert "at step 5, at or past this run's last step 2 (--max-steps 2)" in nothing.value.message
    assert "raise --max-steps above 5" in nothing.value.hint and "--fresh" in nothing.value.hint

    # a longer one resumes and says from where
    capsys.readouterr()
    assert train(ckpt, max_steps=6)["steps"] == 6
    assert "Resumed from " in capsys.readouterr().out

    # --fresh: from step 0, the old checkpoints kept beside
    result = train(ckpt, max_steps=3, strategy="zero1", fresh=True)
    assert result["steps"] == 3 and result["strategy"] == "zero1"
    out = capsys.readouterr().out
    assert "--fresh: moved the checkpoints" in out and "Resumed from" not in out
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("ckpt.before-")]
    assert len(aside) == 1 and any(p.name.startswith("ckpt-00000006") for p in aside[0].iterdir())


def test_a_restarted_run_that_had_finished_ends_cleanly():
    """A restart or requeue after the final save (attempt > 0) has nothing left to do: not an error."""
    from trainscale.train.loop import Loop

    said: list[str] = []
    loop = SimpleNamespace(
        rt=SimpleNamespace(attempt=1, print=said.append),
        step=10,
        total=10,
        directory="d",
        opts=SimpleNamespace(max_steps=10, epochs=1),
    )
    Loop._nothing_to_train(loop, SimpleNamespace(path="d/ckpt-00000010.pt"))
    assert said == ["Nothing left to train: d/ckpt-00000010.pt is at step 10, the run's last (--max-steps 10)"]
    loop.rt.attempt = 0
    with pytest.raises(CheckpointError, match="resuming would train nothing"):
        Loop._nothing_to_train(loop, SimpleNamespace(path="d/ckpt-00000010.pt"))


def _on_two_ranks(directory: str, epochs: int) -> tuple[int, str]:
    import contextlib
    import io

    said = io.StringIO()
    with contextlib.redirect_stdout(said):
        steps = train(directory, epochs=epochs)["steps"]
    return steps, said.getvalue()


@pytest.mark.slow
def test_an_end_of_epoch_checkpoint_of_one_rank_resumes_on_two_where_it_ended(tmp_path):
    """issue 35 item 4: an end-of-epoch checkpoint of one rank was refused on 2 ranks as "would train nothing"
    (step 8 of 1 rank compared with 2 ranks' last step 4). One epoch of one rank is one epoch of two: the second
    epoch is trained (4 steps of 2 ranks after the 8 of one), and the global batch's change is said (8 of one
    rank is no whole number of micro-batches of 2 x 8)."""
    from helpers.multiproc import run_on_ranks

    ckpt = tmp_path / "ckpt"
    assert train(ckpt, epochs=1)["steps"] == 8  # 64 samples, batch 8, one rank
    found = run_on_ranks(_on_two_ranks, 2, str(ckpt), 2, timeout=120)
    steps, said = found[0]
    assert steps == 12 and found[1][0] == 12, found  # epoch 2 of 2: 4 steps of 2 ranks after the 8 of epoch 1
    assert "at step 8 (epoch 2, 0 of its 64 samples done); written with world size 1, now 2" in said, said
    assert "global batch 8 (the checkpoint's, on 1 rank(s)) is now 16 on 2 rank(s)" in said, said
