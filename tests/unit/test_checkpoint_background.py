"""Checkpoints saved in the background (checkpoint/background.py) on one process: the state is copied
when save() returns, only a complete checkpoint becomes visible, one save is in flight at most, a
failed background save is reported with its path and the fix, and process exit finishes the save.
The same on real gloo ranks, and through the training loop: tests/integration/test_checkpoint_async.py."""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading

import pytest
import torch

import trainscale
from trainscale.checkpoint import Checkpointer, background, find_latest, layout, list_checkpoints
from trainscale.checkpoint.state import DCP, FILE, NATIVE
from trainscale.errors import CheckpointError, ConfigError
from trainscale.strategies import get_strategy
from trainscale.strategies.base import OptimizerSpec
from trainscale.train import TrainOptions
from trainscale.train.options import options_from_args


@pytest.fixture
def rt(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # torch sets it on first use
    with trainscale.init(environ={}, set_threads=False) as runtime:
        yield runtime


def _trained(rt, strategy_name: str):
    """A strategy's model and optimizer after one step (Adam state included), and its strategy."""
    strategy = get_strategy(strategy_name)
    torch.manual_seed(0)
    model, opt = strategy.wrap(torch.nn.Linear(8, 4), OptimizerSpec(torch.optim.Adam, {"lr": 0.1}), rt)
    strategy.backward_loss(model(torch.ones(2, 8)).sum(), model)
    strategy.micro_step(opt, model, last=True)
    return strategy, model, opt


class Held:
    """Replaces background.hold_point: the background save of ``step`` stops where it would become
    visible until released; ``reached`` is set when it gets there."""

    def __init__(self, step: int) -> None:
        self.step, self.reached, self.release = step, threading.Event(), threading.Event()

    def __call__(self, step: int) -> None:
        if step == self.step:
            self.reached.set()
            assert self.release.wait(timeout=120), "never released"


@pytest.mark.parametrize("strategy_name", ["ddp", "fsdp"])  # a rank-0 file, DCP shards
def test_only_a_complete_background_save_is_visible_and_it_holds_the_state_of_its_step(
    tmp_path, rt, monkeypatch, strategy_name
):
    held = Held(step=2)
    monkeypatch.setattr(background, "hold_point", held)
    strategy, model, opt = _trained(rt, strategy_name)
    ck = Checkpointer(tmp_path, rt, strategy=strategy, asynchronous=True, keep=5)
    assert ck.asynchronous
    state = {"model": strategy.checkpoint_state(model, opt), "step": 1}
    ck.save(1, state)
    ck.wait()
    expected = {k: v.clone() for k, v in strategy.unwrap(model).state_dict().items()}
    ck.save(2, {**state, "step": 2})
    assert held.reached.wait(timeout=120), "the background save never got to its last step"
    with torch.no_grad():  # training goes on, changing the state in place while the save is in flight
        for p in model.parameters():
            p.add_(1.0)
    # written but not visible: a temporary file / a partial directory, and the previous one is newest
    assert find_latest(tmp_path).step == 1
    assert not list(tmp_path.glob("ckpt-00000002*"))
    assert list(layout.leftovers(tmp_path))
    held.release.set()
    ck.wait()
    ck.close()
    found = ck.latest()
    assert found.step == 2 and found.contents["step"] == 2
    assert not list(layout.leftovers(tmp_path))
    fresh_strategy, fresh_model, fresh_opt = _trained(rt, strategy_name)
    with torch.no_grad():
        for p in fresh_model.parameters():
            p.zero_()
    Checkpointer(tmp_path, rt, strategy=fresh_strategy).restore(
        {"model": fresh_strategy.checkpoint_state(fresh_model, fresh_opt)}
    )
    restored = fresh_strategy.unwrap(fresh_model).state_dict()
    for key, value in expected.items():  # the state when save() returned, not after the in-place change
        assert torch.equal(restored[key], value), key


def test_the_next_save_stages_only_after_the_one_in_flight_is_complete(tmp_path, rt, monkeypatch):
    held = Held(step=1)
    monkeypatch.setattr(background, "hold_point", held)
    ck = Checkpointer(tmp_path, rt, asynchronous=True)
    ck.save(1, {"w": torch.ones(3)})
    assert held.reached.wait(timeout=120)
    waiting = ck._inflight.wait

    def release_then_wait():  # the save in flight may finish only once the next save waits for it
        held.release.set()
        return waiting()

    monkeypatch.setattr(ck._inflight, "wait", release_then_wait)
    staging = ck._stager.stage
    first_complete_when_staging = []
    monkeypatch.setattr(
        ck._stager,
        "stage",
        lambda state: (first_complete_when_staging.append(layout.file_path(tmp_path, 1).exists()), staging(state))[1],
    )
    ck.save(2, {"w": torch.zeros(3)})
    ck.wait()
    ck.close()
    assert first_complete_when_staging == [True]
    assert find_latest(tmp_path).step == 2


def test_one_save_in_flight_at_most():
    inflight, release = background.InFlight(), threading.Event()
    inflight.start(1, "ckpt-1", lambda: release.wait(timeout=120))
    assert inflight.busy
    with pytest.raises(RuntimeError, match="the save of step 1 is still in flight: wait"):
        inflight.start(2, "ckpt-2", lambda: None)
    release.set()
    assert inflight.wait() is None and not inflight.busy
    inflight.start(2, "ckpt-2", lambda: None)
    assert inflight.wait() is None
    inflight.close()


def test_a_failed_background_save_fails_the_next_save_naming_the_path_and_the_fix(tmp_path, rt, monkeypatch):
    ck = Checkpointer(tmp_path, rt, asynchronous=True)
    ck.save(1, {"w": torch.ones(3)})
    ck.wait()

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device (injected)")

    monkeypatch.setattr(torch, "save", disk_full)
    ck.save(2, {"w": torch.zeros(3)})  # staged; the write fails in the background
    with pytest.raises(
        CheckpointError, match="the background save of step 2 to .*ckpt-00000002.pt failed: the disk holding .* is full"
    ) as caught:
        ck.save(3, {"w": torch.zeros(3)})
    assert "--no-checkpoint-async" in caught.value.hint and str(tmp_path) in caught.value.hint
    monkeypatch.undo()
    assert ck.latest().step == 1
    assert not list(layout.leftovers(tmp_path))  # the failed write left no temporary file
    ck.save(4, {"w": torch.zeros(3)})  # reported once; the next save goes ahead
    ck.wait()
    ck.close()
    assert ck.latest().step == 4


EXITS_WITHOUT_WAITING = """
import sys, threading
import torch
import trainscale
from trainscale.checkpoint import Checkpointer, background

ended = threading.Event()
background.hold_point = lambda step: ended.wait()  # the write goes on only once the script has ended
with trainscale.init(environ={}, set_threads=False) as rt:
    # 64 MB: a daemon thread would be cut off while writing it
    Checkpointer(sys.argv[1], rt, asynchronous=True).save(7, {"w": torch.arange(16 * 2**20, dtype=torch.float32)})
print("save returned", flush=True)
ended.set()  # the last statement: no wait(), no close()
"""


def test_process_exit_finishes_the_save_in_flight(tmp_path):
    script = tmp_path / "exits.py"
    script.write_text(EXITS_WITHOUT_WAITING)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ck")], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and "save returned" in done.stdout, done.stderr
    found = find_latest(tmp_path / "ck")
    assert (
        found is not None
        and found.step == 7
        and torch.equal(found.contents["w"], torch.arange(16 * 2**20, dtype=torch.float32))
    )


# -------------------------------------------------------------------------- where it is safe, and options
def test_background_saves_where_the_storage_allows_them():
    assert FILE.resolve_async(None, "ddp") and DCP.resolve_async(None, "fsdp")
    assert not FILE.resolve_async(False, "ddp")
    assert not NATIVE.resolve_async(None, "deepspeed")  # auto: synchronous there
    assert not NATIVE.resolve_async(False, "deepspeed")
    with pytest.raises(ConfigError, match="engine writes its own checkpoint files") as caught:
        NATIVE.resolve_async(True, "deepspeed")
    assert "--no-checkpoint-async" in caught.value.hint


def test_checkpoint_async_where_it_cannot_be_done_is_refused():
    with pytest.raises(ConfigError, match="the deepspeed strategy's engine writes its own checkpoint files"):
        TrainOptions(strategy="deepspeed", checkpoint_async=True)
    assert TrainOptions(strategy="deepspeed").checkpoint_async is None  # auto: synchronous there
    assert TrainOptions(strategy="fsdp", checkpoint_async=True).checkpoint_async is True


def test_a_checkpointer_over_native_files_refuses_background_saves(rt, tmp_path):
    # under tmp_path, not the working directory: a Checkpointer that takes its lock once left unused/.trainscale.lock
    # in the repository (inside a folder that existed, which the no-stray-files fixture does not look into)
    with pytest.raises(ConfigError, match="engine writes its own checkpoint files"):
        Checkpointer(tmp_path, rt, strategy=get_strategy("deepspeed"), asynchronous=True)
    assert not Checkpointer(tmp_path, rt, strategy=get_strategy("deepspeed"), asynchronous=None).asynchronous
    assert not Checkpointer(tmp_path, rt).asynchronous  # the library's default stays synchronous


def test_checkpoint_async_resolves_from_command_line_environment_and_config_file(tmp_path):
    config = tmp_path / "job.toml"
    config.write_text("[train]\ncheckpoint_async = false\n")

    def resolved(argv: list[str], environ: dict[str, str]) -> bool | None:
        from trainscale.train.options import add_common_arguments

        parser = argparse.ArgumentParser()
        add_common_arguments(parser)
        return options_from_args(parser.parse_args(argv), environ=environ)[0].checkpoint_async

    assert resolved([], {}) is None  # auto
    assert resolved(["--checkpoint-async"], {}) is True
    assert resolved(["--no-checkpoint-async"], {}) is False
    assert resolved(["--config", str(config)], {}) is False
    assert resolved(["--config", str(config)], {"TRAINSCALE_TRAIN_CHECKPOINT_ASYNC": "1"}) is True
    assert resolved(["--config", str(config), "--checkpoint-async"], {"TRAINSCALE_TRAIN_CHECKPOINT_ASYNC": "0"}) is True
    assert resolved([], {"TRAINSCALE_TRAIN_CHECKPOINT_ASYNC": "none"}) is None


# -------------------------------------------------------------------------- the training loop
def test_a_preemption_finishes_the_save_in_flight_then_saves_its_step_before_the_requeue(tmp_path, rt, monkeypatch):
    from trainscale.data import DeviceTensorLoader
    from trainscale.runtime.preemption import Preemption
    from trainscale.train import Loop, Task

    held = Held(step=2)  # the periodic save of step 2 is still being written when the signal comes
    monkeypatch.setattr(background, "hold_point", held)
    waiting = background.InFlight.wait

    def release_then_wait(self):  # ... and may finish only once something waits for it
        if self.busy:
            held.release.set()
        return waiting(self)

    monkeypatch.setattr(background.InFlight, "wait", release_then_wait)
    loader = DeviceTensorLoader(torch.randn(64, 4), torch.randn(64, 1), batch_size=8)
    task = Task(
        name="t",
        model=lambda: torch.nn.Linear(4, 1),
        optimizer=OptimizerSpec(torch.optim.SGD, {"lr": 0.1}),
        loss=lambda model, batch: torch.nn.functional.mse_loss(model(batch[0]), batch[1]),
        loader=loader,
        samples=64,
    )
    opts = TrainOptions(batch_size=8, epochs=1, checkpoint_dir=str(tmp_path), checkpoint_every=2, log_every=0)
    loop = Loop(rt, opts, task)
    monkeypatch.setattr(Preemption, "requested", lambda self: loop.step >= 3)
    on_disk_at_requeue = []
    monkeypatch.setattr(
        Preemption,
        "requeue_and_log",
        lambda self, head, say: on_disk_at_requeue.append([step for step, _ in list_checkpoints(tmp_path)]),
    )
    result = loop.run()
    assert result["preempted"] and result["steps"] == 3 and result["checkpoint_async"] is True
    assert held.reached.is_set()
    assert on_disk_at_requeue == [[3, 2]]  # both complete before the requeue, nothing partial
    assert not list(layout.leftovers(tmp_path))
    assert len(result["checkpoint_stall_s"]) == 2  # the periodic save, the preemption's
