"""Timing on GPUs (the one clock of a step, observe/steps.py), with torch's CUDA events and synchronisation
faked at their narrow seam: a fake device timeline stands for the GPU, where queued work finishes later than
the host moves on."""

from __future__ import annotations

import pytest
import torch

from trainscale.observe.steps import StepMarks


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

            def elapsed_time(self, end: Event) -> float:
                return (end.at - self.at) * 1000.0  # milliseconds, as torch's

            def query(self) -> bool:
                return True

            def synchronize(self) -> None:  # waits for this event only, not for the whole device
                pass

        self.Event = Event

    def synchronize(self, device=None) -> None:
        self.syncs += 1


@pytest.fixture
def gpu(monkeypatch):
    fake = FakeDevice()
    monkeypatch.setattr(torch.cuda, "Event", fake.Event)
    monkeypatch.setattr(torch.cuda, "synchronize", fake.synchronize)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: fake.streams.append(device))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    return fake


def test_nccl_communication_is_measured_on_the_device_not_when_it_was_queued(gpu):
    """NCCL's all-reduce is queued at once: host timestamps gave ~0 s of communication. On the device's timeline
    the 0.3 s DDP's end-of-backward callback made the stream wait for is the step's exposed communication."""
    marks = StepMarks(torch.device("cuda", 0))
    marks.start_step()
    gpu.now = 0.05
    marks.mark("data")
    gpu.now = 0.20
    marks.mark("forward")
    gpu.now = 0.50  # backward's kernels queued; its own work ends at 0.50 s on the device
    marks.mark("backward")  # the recorder's first end-of-backward callback
    gpu.now = 0.80  # DDP's callback makes the stream wait for the all-reduce, done at 0.80 s
    marks.mark("sync")  # the recorder's second callback, after DDP's
    gpu.now = 0.85
    marks.mark("optimizer")
    marks.end_step({"step": 1})
    (record,) = marks.ready(flush=True)
    assert record["comm_s"] == pytest.approx(0.30) and record["backward_s"] == pytest.approx(0.30)
    assert record["compute_s"] == pytest.approx(0.15) and record["step_s"] == pytest.approx(0.85)
    assert gpu.syncs == 0  # no device synchronisation: events read when they have completed
    assert set(gpu.streams) == {torch.device("cuda", 0)}  # every event on this rank's GPU, from any thread


def test_the_classify_loop_times_its_epochs_with_the_device_waited_for(monkeypatch, in_tmp):
    """Epoch time read without a device synchronisation inflated samples/s and speedups on GPUs."""
    from trainscale.runtime.runtime import Runtime
    from trainscale.workloads import cnn

    waits = []
    monkeypatch.setattr(Runtime, "synchronize", lambda self: waits.append(1))
    # torch may point TORCHINDUCTOR_CACHE_DIR somewhere on first use; monkeypatch restores it
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(in_tmp / "inductor"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    result = cnn.main(
        ["--data", "synthetic", "--samples", "64", "--batch-size", "16", "--epochs", "2", "--log-every", "0"]
    )
    assert len(result["epochs"]) == 2
    assert len(waits) >= 4  # start and stop of each epoch
