"""Optional per-step breakdown: data loading, forward+backward, gradient communication, optimizer.

Off by default: timing each section needs a device synchronisation, which costs a little on GPUs.
Communication is measured by a DDP communication hook that timestamps each bucket's all-reduce:

- ``communication``: *exposed* communication, the time backward still waited for all-reduces after
  the last gradient was ready (the part DDP could not hide behind backward); it is taken out of
  ``compute`` so that data + compute + communication + optimizer adds up to the timed sections;
- ``communication_total``: how long any all-reduce was in flight (hidden plus exposed).

Every section is averaged over the ranks, as the epoch time is.

On CUDA the hook's completion callback runs when the NCCL work is done only after a stream
synchronisation, so the split is exact on CPU (gloo) and approximate on GPUs.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import defaultdict
from typing import Iterator

import torch


class StepTimer:
    def __init__(self, runtime, model, enabled: bool) -> None:
        self.enabled = enabled
        self.runtime = runtime
        self.device = runtime.device
        self.totals: dict[str, float] = defaultdict(float)
        self.comm_total_s = 0.0
        self.buckets = 0  # most all-reduces seen in one step (DDP's gradient buckets)
        self._lock = threading.Lock()
        self._intervals: list[list[float]] = []  # [start, end] of this step's bucket all-reduces
        self.gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        if enabled and hasattr(model, "register_comm_hook"):
            model.register_comm_hook(self, _timed_allreduce)

    def start_epoch(self) -> None:
        self.totals.clear()
        self.comm_total_s = 0.0

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    @contextlib.contextmanager
    def section(self, name: str) -> Iterator[None]:
        if not self.enabled:
            yield
            return
        self._sync()
        with self._lock:
            self._intervals = []
        start = time.perf_counter()
        yield
        self._sync()
        end = time.perf_counter()
        exposed = self._exposed(end)
        self.totals[name] += end - start - exposed
        if exposed:
            self.totals["communication"] += exposed

    def _exposed(self, end: float) -> float:
        """Account this section's all-reduces; return the time spent after the last bucket became ready."""
        with self._lock:
            intervals = [(s, e if e else end) for s, e in self._intervals]
            self._intervals = []
        if not intervals:
            return 0.0
        self.comm_total_s += _union_length(intervals)
        self.buckets = max(self.buckets, len(intervals))
        last_ready = max(s for s, _ in intervals)
        return max(0.0, min(end, max(e for _, e in intervals)) - last_ready)

    def _begin(self) -> list[float]:
        interval = [time.perf_counter(), 0.0]
        with self._lock:
            self._intervals.append(interval)
        return interval

    def summary(self) -> dict[str, float] | None:
        """This epoch's seconds per section, averaged over the ranks like the epoch time they divide
        (one rank's sections alone can add up to more than the ranks' mean epoch time). A collective:
        every rank calls it."""
        if not self.enabled:
            return None
        out = {key: self.totals.get(key, 0.0) for key in ("data", "compute", "communication", "optimizer")}
        out.update({k: v for k, v in sorted(self.totals.items()) if k not in out})
        out["communication_total"] = self.comm_total_s
        out = dict(zip(out, self.runtime.means(list(out.values()))))
        out["gradient_bytes"] = self.gradient_bytes
        out["buckets"] = self.buckets
        return out


def _union_length(intervals: list[tuple[float, float]]) -> float:
    total, cur_start, cur_end = 0.0, None, None
    for s, e in sorted(intervals):
        if cur_end is None or s > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = s, e
        else:
            cur_end = max(cur_end, e)
    if cur_end is not None:
        total += cur_end - cur_start
    return total


def _timed_allreduce(timer: StepTimer, bucket):
    import torch.distributed as dist

    interval = timer._begin()
    tensor = bucket.buffer()
    tensor.div_(dist.get_world_size())
    fut = dist.all_reduce(tensor, async_op=True).get_future()

    def done(f):
        interval[1] = time.perf_counter()
        return f.value()[0]

    return fut.then(done)
