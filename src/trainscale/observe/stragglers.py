"""Stragglers named while training: one slow rank holds every other rank back at each collective.

A synchronous step makes every rank wait for the slowest, so the ranks' step times look alike; their own
times (data wait and compute, measured before the gradient all-reduce) tell the slow rank apart, and the
verdict compares those. Rank 0 looks in a side thread, reading the summaries the ranks publish to the
store (observe/window.py) or, without one, the ends of their record files. Thresholds, causes and
costs: docs/observability.md ("Stragglers") and docs/scaling.md.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from trainscale.observe.records import metrics_dir, note_event
from trainscale.observe.window import RankWindow, default_store, own_connection, own_time, read_all

DEFAULT_RATIO = 1.2
DEFAULT_WINDOW = 20


@dataclass(frozen=True)
class Straggler:
    rank: int
    host: str
    slower_by: float
    """Its own time per step over the others' median, minus one (0.28 = 28% slower)."""
    own_s: float
    others_s: float
    cause: str

    def describe(self) -> str:
        return (f"rank {self.rank} on {self.host} was {self.slower_by:.0%} slower over the last steps "
                f"({self.own_s * 1e3:.1f} ms of its own work per step vs {self.others_s * 1e3:.1f} ms on the others): "
                f"{self.cause}")


def _cause(mine: dict[str, Any], others: list[dict[str, Any]]) -> str:
    def median(values: list[float | None]) -> float:
        known = [v for v in values if v is not None]
        return statistics.median(known) if known else 0.0

    data, data_o = mine.get("data") or 0.0, median([o.get("data") for o in others])
    comp, comp_o = mine.get("compute") or 0.0, median([o.get("compute") for o in others])
    cpus = len(mine.get("cpus") or [])
    cpus_o = median([len(o.get("cpus") or []) for o in others])
    if data - data_o > max(comp - comp_o, 0.0) and data > data_o:
        return (f"data wait ({data * 1e3:.1f} ms per step vs {data_o * 1e3:.1f} ms): its loader cannot keep up "
                "(DataLoader workers, I/O, a slow file system)")
    if cpus and cpus_o and cpus < cpus_o:
        return (f"CPU binding: it may use {cpus} CPU(s), the others {cpus_o:g} (trainscale profiles --here shows the plan; "
                "check the job's CPU layout)")
    shared = set(mine.get("cpus") or []) & {c for o in others if o.get("node") == mine.get("node")
                                            for c in (o.get("cpus") or [])}
    if shared:
        return f"CPU binding: it shares CPU(s) {sorted(shared)[:8]} with another rank of its node"
    return (f"compute ({comp * 1e3:.1f} ms per step vs {comp_o * 1e3:.1f} ms): a slower, throttled or busier device "
            "(nvidia-smi / rocm-smi on its node; trainscale jobs JOBID --attach --node HOST)")


def find_in_windows(windows: dict[int, dict[str, Any]], *, ratio: float = DEFAULT_RATIO,
                    window: int = DEFAULT_WINDOW) -> Straggler | None:
    """Pure: from each rank's summary of its last two windows (observe/window.py), the slowest rank when it
    stands out by ``ratio`` in the last window and was the slowest by ``ratio`` in the window before too (a
    passing hiccup, another job's burst on a shared core, is not a straggler). Linear in the ranks. The
    windows are the ranks' own (``w`` in a summary; ``window`` where a summary does not say)."""
    if len(windows) < 2 or any(w.get("n", 0) < 2 * w.get("w", window) for w in windows.values()):
        return None

    def slowest(key: str) -> tuple[int, float, float] | None:
        own = {r: float(w[key]) for r, w in windows.items()}
        worst = max(own, key=own.get)
        others = statistics.median(v for r, v in own.items() if r != worst)
        return (worst, own[worst], others) if others > 0 and own[worst] / others >= ratio else None

    now, before = slowest("now"), slowest("before")
    if now is None or before is None or now[0] != before[0]:
        return None
    worst, mine, others = now
    return Straggler(rank=worst, host=windows[worst].get("node") or "?", slower_by=mine / others - 1, own_s=mine,
                     others_s=others, cause=_cause(windows[worst], [w for r, w in windows.items() if r != worst]))


def summarise(records: list[dict[str, Any]], window: int = DEFAULT_WINDOW) -> dict[str, Any]:
    """One rank's records (its meta record and steps, in order) as the summary it would publish."""
    summary = RankWindow(window, next((x for x in records if x.get("kind") == "meta"), {}))
    for record in records:
        if record.get("kind") == "step":
            summary.add(record)
    return summary.summary()


def find_straggler(ranks: dict[int, list[dict]], *, ratio: float = DEFAULT_RATIO,
                   window: int = DEFAULT_WINDOW) -> Straggler | None:
    """Pure: :func:`find_in_windows` over each rank's records (its meta record and steps)."""
    return find_in_windows({r: summarise(recs, window) for r, recs in ranks.items()}, ratio=ratio, window=window)


class RankTail:
    """One rank's record file, read from where the last read stopped: its meta record and its last ``keep``
    steps with an own time. A line still being written is left for the next read. Never more than ``keep``
    lines' worth of bytes at a time: a watch that starts on a day-long run's files, or falls behind, skips
    to their ends (only the last two windows matter)."""

    LINE_BYTES = 2048
    """Generous for one step record (about 250 bytes)."""

    def __init__(self, path: Path, keep: int) -> None:
        self.path, self.offset, self.keep = path, 0, keep
        self.meta: dict[str, Any] | None = None
        self.steps: deque[dict[str, Any]] = deque(maxlen=keep)

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                if self.meta is None and self.offset == 0:
                    self._take(fh.readline())
                    fh.seek(0)
                size = os.fstat(fh.fileno()).st_size
                budget = self.keep * self.LINE_BYTES
                if size - self.offset > budget:  # behind by more than the lines kept: only the last ones count
                    fh.seek(size - budget)
                    fh.readline()  # the cut line
                    self.offset = fh.tell()
                else:
                    fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            chunk = b""
        complete = chunk.rfind(b"\n") + 1
        for line in chunk[:complete].splitlines():
            self._take(line)
        self.offset += complete
        return ([self.meta] if self.meta else []) + list(self.steps)

    def _take(self, line: bytes) -> None:
        try:
            record = json.loads(line)
        except ValueError:
            return
        if record.get("kind") == "meta":
            if self.meta is None:
                self.meta = record
        elif record.get("kind") == "step" and own_time(record) is not None:
            self.steps.append(record)


class StragglerWatch:
    """Rank 0's side thread: every ``every_s`` seconds, look at the ranks' last steps and name a straggler once.

    ``store``: where the ranks publish their summaries (observe/window.py); "auto" (default) is this
    process group's, when there is one of two or more ranks; None reads the record files in ``run_dir``."""

    def __init__(self, run_dir, *, say: Callable[[str], None], every_s: float = 10.0, ratio: float = DEFAULT_RATIO,
                 window: int = DEFAULT_WINDOW, store: Any = "auto", world_size: int | None = None) -> None:
        self.run_dir, self.say, self.every_s = Path(run_dir), say, every_s
        self.ratio, self.window = ratio, window
        self.found: Straggler | None = None
        self.tails: dict[Path, RankTail] = {}
        if store == "auto":
            store = default_store()
            if store is not None:
                import torch.distributed as dist

                world_size = dist.get_world_size()
                store = own_connection(store)
        self.store, self.world_size = store, world_size
        if store is not None and not world_size:
            raise ValueError("StragglerWatch: a store needs the world size")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trainscale-stragglers", daemon=True)

    def start(self) -> "StragglerWatch":
        self._thread.start()
        return self

    def windows(self) -> dict[int, dict[str, Any]] | None:
        """Every rank's summary of its last two windows: from the store, else from the record files."""
        if self.store is not None:
            try:
                return read_all(self.store, self.world_size)
            except Exception:  # the store went away (the run is ending): nothing more to say
                return None
        return {int(p.stem.split("-", 1)[1]): summarise(self.tails.setdefault(p, RankTail(p, 2 * self.window)).read(),
                                                        self.window)
                for p in metrics_dir(self.run_dir).glob("rank-*.jsonl")}

    def check(self) -> Straggler | None:
        if self.found is not None:
            return None
        windows = self.windows()
        found = find_in_windows(windows, ratio=self.ratio, window=self.window) if windows else None
        if found is not None:
            self.found = found
            self.say(f"trainscale: straggler: {found.describe()}")
            note_event(self.run_dir, kind="straggler", rank=found.rank, host=found.host, slower_by=found.slower_by,
                       cause=found.cause)
        return found

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s) and self.found is None:
            self.check()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.every_s + 5)
