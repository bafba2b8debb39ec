"""Optional per-step breakdown: data loading, forward+backward (incl. exposed communication), optimizer.

Off by default: timing each section needs a device synchronisation, which costs a little on GPUs.
Communication is measured by a DDP communication hook that timestamps each bucket's all-reduce.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from typing import Iterator

import torch


class StepTimer:
    def __init__(self, runtime, model, enabled: bool) -> None:
        self.enabled = enabled
        self.device = runtime.device
        self.totals: dict[str, float] = defaultdict(float)
        self.comm_s = 0.0
        self.steps = 0
        if enabled and hasattr(model, "register_comm_hook"):
            model.register_comm_hook(self, _timed_allreduce)

    def start_epoch(self) -> None:
        self.totals.clear()
        self.comm_s = 0.0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        self._sync()
        start = time.perf_counter()
        yield
        self._sync()
        self.totals[name] += time.perf_counter() - start

    def summary(self) -> dict[str, float] | None:
        if not self.enabled:
            return None
        out = dict(self.totals)
        out["communication"] = self.comm_s
        return out


def _timed_allreduce(timer: StepTimer, bucket):
    import torch.distributed as dist

    start = time.perf_counter()
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size())
    work = dist.all_reduce(tensor, async_op=True)
    fut = work.get_future()

    def done(f):
        timer.comm_s += time.perf_counter() - start
        return f.value()[0]

    return fut.then(done)
