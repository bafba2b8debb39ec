"""Each rank's own summary of its last steps, published to the process group's store for the straggler watch.

Rank 0 must not read every rank's record file every 10 s: at 1,024 ranks on a parallel file system that is
1,024 opens and all their new lines per look (benchmarks/rank_costs.py). So each rank keeps its own last
two windows of steps and, when it writes its records, puts a few numbers in the store under
``trainscale/window/<R>``:

    {"w": the window, "n": steps kept (up to 2 w), "now": median own time of the last window, "before": of
     the window before, "step": median step, "phases": {phase: median seconds} of the last window,
     "cpu_wait": median seconds its main thread waited for a CPU (Linux's run queue), "loader": whether a
     DataLoader fed it, "node": ..., "cpus": [...],
     "mean": {"now", "before", "step", "phases": the same as means}, "spikes": [steps of the window before,
     of the last, far above the window's median own time], "own": [[step, own time] of both windows]}

The means and spikes see work that holds the others up in some steps only (an evaluation every 10 steps),
which the medians leave out.

A rank's own time is its step less its waits at the collectives (``comm_s``): the rank that arrives
last at them waits least there, so it has the most. Rank 0 reads all of them with one
``multi_get`` (observe/stragglers.py): its work per look is one small value per rank, whatever the run's
length, and no file is opened.
"""

from __future__ import annotations

import json
import statistics
import time
from collections import deque
from typing import Any

KEY = "trainscale/window/{rank}"
PUBLISH_EVERY_S = 0.5
"""At most this often per rank (a recorder flushing every step must not talk to the store every step)."""
PHASES = {
    "data": "data_s",
    "loader": "loader_s",
    "forward": "compute_s",
    "between": "between_s",
    "backward": "backward_s",
    "optimizer": "optimizer_s",
}
"""A step's phases (observe/steps.py) as a straggler is named by; ``loader`` (the DataLoader's time) lies
inside ``data`` or ``between``, and ``other`` is the rest of the step less the wait (``comm_s``)."""


def own_time(record: dict[str, Any]) -> float | None:
    """A rank's own work in a step: the step less its wait at the collective."""
    step = record.get("step_s")
    return None if step is None else float(step) - float(record.get("comm_s") or 0.0)


def phases(record: dict[str, Any]) -> dict[str, float]:
    """A step record's phases in seconds, ``other`` the rest of its own time."""
    out = {name: float(record.get(field) or 0.0) for name, field in PHASES.items()}
    out["other"] = max(0.0, (own_time(record) or 0.0) - sum(v for k, v in out.items() if k != "loader"))
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


SPIKE_MIN_S = 0.002
"""A step is a spike when its own time exceeds the window's median by half the window's largest excess, and by
this at least (timer noise)."""


def spikes(own: list[float]) -> int:
    """How many of a window's steps stand far above its median own time (:data:`SPIKE_MIN_S`)."""
    if not own:
        return 0
    median = statistics.median(own)
    bar = max(SPIKE_MIN_S, 0.5 * (max(own) - median))
    return sum(1 for t in own if t - median >= bar)


class RankWindow:
    """One rank's last ``2 * window`` step records, summarised on demand (at most every half second: a record
    added costs an append)."""

    def __init__(self, window: int, meta: dict[str, Any] | None = None) -> None:
        self.window = window
        self.steps: deque[dict[str, Any]] = deque(maxlen=2 * window)
        self.loader = False
        self.meta = {
            "node": (meta or {}).get("node") or (meta or {}).get("host", "?"),
            "cpus": list((meta or {}).get("cpus") or []),
        }

    def add(self, record: dict[str, Any]) -> None:
        if record.get("kind", "step") == "step" and record.get("step_s") is not None:
            self.steps.append(record)
            self.loader = self.loader or "loader_s" in record

    def summary(self) -> dict[str, Any]:
        steps = [(own_time(r), float(r["step_s"]), phases(r), r.get("cpu_wait_s")) for r in self.steps]
        last, before = steps[-self.window :], steps[: -self.window]
        return {
            "w": self.window,
            "n": len(steps),
            "now": _median([s[0] for s in last]),
            "before": _median([s[0] for s in before]),
            "step": _median([s[1] for s in last]),
            "phases": {k: _median([s[2][k] for s in last]) for k in (last[0][2] if last else ())},
            "cpu_wait": _median([s[3] for s in last if s[3] is not None]),
            "mean": {
                "now": _mean([s[0] for s in last]),
                "before": _mean([s[0] for s in before]),
                "step": _mean([s[1] for s in last]),
                "phases": {k: _mean([s[2][k] for s in last]) for k in (last[0][2] if last else ())},
            },
            "spikes": [spikes([s[0] for s in before]), spikes([s[0] for s in last])],
            # each step's own time by its number: rank 0 aligns the ranks' steps (a straggler is the last to
            # arrive in most of them, not ranks taking turns)
            "own": [
                [int(r["step"]), round(s[0], 6)]
                for r, s in zip(self.steps, steps)  # both windows: the ranks publish at their own moments
                if r.get("step") is not None
            ],
            "loader": self.loader,
            **self.meta,
        }


def default_store() -> Any:
    """The process group's store when this process is one of several ranks, else None."""
    try:
        import torch.distributed as dist  # noqa: PLC0415 (optional dependency)

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
            return None
        return dist.distributed_c10d._get_default_store()
    except Exception:  # no process group, or a torch without the accessor: the files are read instead
        return None


def own_connection(store: Any) -> Any:
    """A connection of the reader's own (torch >= 2.5): rank 0's watch thread never shares the main
    thread's connection, nor waits with its timeout."""
    try:
        return store.clone()
    except Exception:
        return store


class Publisher:
    """Puts a rank's window summary in the store, at most every ``every_s`` seconds (and at the end)."""

    def __init__(self, store: Any, rank: int, window: RankWindow, every_s: float = PUBLISH_EVERY_S) -> None:
        self.store, self.key, self.window, self.every_s = store, KEY.format(rank=rank), window, every_s
        self._at = float("-inf")

    def maybe(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.store is None or (not force and now - self._at < self.every_s):
            return
        self._at = now
        try:
            self.store.set(self.key, json.dumps(self.window.summary(), separators=(",", ":")))
        except Exception:  # the store went away (teardown, rank 0 gone): the watch is a nicety
            self.store = None


def read_all(store: Any, world_size: int) -> dict[int, dict[str, Any]] | None:
    """Every rank's published summary (one round trip), or None while some rank has published none yet."""
    keys = [KEY.format(rank=r) for r in range(world_size)]
    if not store.check(keys):
        return None
    return {r: json.loads(raw) for r, raw in enumerate(store.multi_get(keys))}
