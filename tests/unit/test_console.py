"""Rank 0's progress lines: when they come, their rate and ETA (a fake clock: no waiting)."""

from __future__ import annotations

from trainscale.train.console import Progress, duration


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def steps(progress: Progress, clock: Clock, first: int, last: int, seconds_per_step: float, epoch_steps: int):
    """Steps first..last at a fixed pace; the (step, line) of every line due."""
    lines = []
    for step in range(first, last + 1):
        clock.now += seconds_per_step
        done = (step - 1) % epoch_steps + 1
        if progress.due(step, done):
            lines.append((step, progress.line((step - 1) // epoch_steps, done, step, 0.5)))
    return lines


def test_lines_come_by_time_with_rate_and_eta():
    clock = Clock()
    progress = Progress(steps_per_epoch=100, total=500, samples_per_step=64, epochs=5, interval_s=10, clock=clock)
    # a line every 20 steps; an epoch's last step has the loop's epoch line instead, and restarts the interval
    lines = steps(progress, clock, 1, 200, 0.5, 100)
    assert [s for s, _ in lines] == [21, 41, 61, 81, 120, 140, 160, 180]
    step, text = lines[1]
    assert text.startswith("Train Epoch: 1/5 |########------------| [2624/6400 (41%)]  Loss: 0.500000")
    assert "  128 samples/s  step 41/500  ETA 3:50" in text  # 64 samples / 0.5 s; 459 steps x 0.5 s
    assert steps(progress, clock, 201, 500, 0.001, 100) == []  # fast steps: no line until 10 s pass


def test_every_n_steps_when_asked_and_never_with_zero():
    clock = Clock()
    progress = Progress(steps_per_epoch=10, total=30, samples_per_step=8, epochs=None, every=4, clock=clock)
    lines = steps(progress, clock, 1, 30, 60.0, 10)
    assert [s for s, _ in lines] == [4, 8, 12, 16, 20, 24, 28]
    assert lines[0][1].startswith("Train Epoch: 1 |")  # no epoch count when --max-steps may run past them
    quiet = Progress(steps_per_epoch=10, total=30, samples_per_step=8, epochs=3, every=0, clock=clock)
    assert steps(quiet, clock, 1, 30, 60.0, 10) == []


def test_eta_leaves_the_first_step_out():
    clock = Clock()
    progress = Progress(steps_per_epoch=10, total=11, samples_per_step=1, epochs=1, clock=clock)
    clock.now += 50  # a slow first step (warm-up, compilation)
    progress.due(1, 1)
    assert progress.eta(1) is None
    clock.now += 2
    progress.due(2, 2)
    assert progress.eta(2) == 18.0  # 9 steps left at 2 s


def test_duration():
    assert [duration(s) for s in (0, 65, 3600 + 62, 2 * 86400 + 7384)] == ["0:00", "1:05", "1:01:02", "2d 2:03:04"]
