"""Timing on GPUs, with torch's CUDA events and synchronisation faked at their narrow seam: a fake
device timeline stands for the GPU, where queued work finishes later than the host moves on."""

from __future__ import annotations

import datetime
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from trainscale.train.timing import EpochClock, StepClock


class FakeDevice:
    """The GPU's own timeline. The host queues work instantly; ``now`` is the device time at which the
    work queued so far on the recording stream completes, so an event recorded now completes then."""

    def __init__(self) -> None:
        self.now = 0.0
        self.syncs = 0
        self.streams: list = []  # the device of every stream an event was recorded on
        device = self

        class Event:
            def __init__(self, enable_timing: bool = False) -> None:
                assert enable_timing, "elapsed_time needs enable_timing=True"
                self.at = None

            def record(self, stream=None) -> None:
                self.at = device.now

            def elapsed_time(self, end: "Event") -> float:
                return (end.at - self.at) * 1000.0  # milliseconds, as torch's

        self.Event = Event

    def synchronize(self, device=None) -> None:
        self.syncs += 1


@pytest.fixture
def gpu(monkeypatch):
    fake = FakeDevice()
    monkeypatch.setattr(torch.cuda, "Event", fake.Event)
    monkeypatch.setattr(torch.cuda, "synchronize", fake.synchronize)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: fake.streams.append(device))
    return fake


def _runtime(device: str = "cuda:0"):
    return SimpleNamespace(device=torch.device(device), means=lambda values: list(values),
                           timeout=datetime.timedelta(seconds=5))


def test_nccl_communication_is_measured_on_the_device_not_when_it_was_queued(gpu):
    """NCCL's future completes when the all-reduce is queued: host timestamps gave ~0 s of
    communication. On the device's timeline the 0.3 s all-reduce after the last bucket is exposed."""
    timer = StepClock(_runtime(), nn.Linear(4, 4), breakdown=True)
    with timer.phase("backward"):
        gpu.now = 0.50                 # forward and backward queued; the last bucket is ready at 0.50 s
        bucket = timer.begin()        # the comm hook, on the stream that produced the bucket
        gpu.now = 0.80                 # the all-reduce queued behind it ends at 0.80 s on the device ...
        timer.end(bucket)             # ... while its future's callback runs on the host right away
    summary = timer.summary()
    assert summary["communication"] == pytest.approx(0.30)
    assert summary["communication_total"] == pytest.approx(0.30)
    assert summary["compute"] == pytest.approx(0.50)
    assert gpu.syncs == 2  # the phase waits for the device at both ends
    assert set(gpu.streams) == {torch.device("cuda", 0)}  # every event on this rank's GPU, from any thread


def test_hidden_all_reduces_count_in_total_but_not_as_exposed(gpu):
    timer = StepClock(_runtime(), nn.Linear(4, 4), breakdown=True)
    with timer.phase("backward"):
        gpu.now = 0.2
        first = timer.begin()         # first bucket ready at 0.2 s
        gpu.now = 0.45
        timer.end(first)              # reduced while backward goes on
        gpu.now = 0.5
        second = timer.begin()        # the last bucket at 0.5 s
        gpu.now = 0.6
        timer.end(second)
    summary = timer.summary()
    assert summary["communication_total"] == pytest.approx(0.35)
    assert summary["communication"] == pytest.approx(0.1)
    assert summary["compute"] == pytest.approx(0.5)
    assert summary["buckets"] == 2


def test_the_epoch_clock_waits_for_the_device_before_reading_the_time(monkeypatch):
    waited = []
    runtime = SimpleNamespace(synchronize=lambda: waited.append("sync"))
    clock = EpochClock(runtime)
    clock.start()
    assert waited == ["sync"]
    assert clock.stop() >= 0.0 and waited == ["sync", "sync"]


def test_the_classify_loop_times_its_epochs_with_the_device_waited_for(monkeypatch, in_tmp):
    """Epoch time read without a device synchronisation inflated samples/s and speedups on GPUs."""
    from trainscale.runtime.runtime import Runtime
    from trainscale.workloads import cnn

    waits = []
    monkeypatch.setattr(Runtime, "synchronize", lambda self: waits.append(1))
    # torch may point TORCHINDUCTOR_CACHE_DIR somewhere on first use; monkeypatch restores it
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(in_tmp / "inductor"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    result = cnn.main(["--data", "synthetic", "--samples", "64", "--batch-size", "16", "--epochs", "2",
                       "--log-every", "0"])
    assert len(result["epochs"]) == 2
    assert len(waits) >= 4  # start and stop of each epoch
