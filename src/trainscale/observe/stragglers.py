"""Stragglers named while training: one slow rank holds every other rank back at each collective.

Rank 0 reads the ranks' own step records (observe/records.py) in a side thread — no collective, nothing
on the step path, and only the lines written since its last look, keeping the last two windows of each
rank (a day-long run's files are not parsed again every few seconds) — and when one rank's step time
stays above the others' by more than ``ratio`` over a window of ``window`` steps, says once which rank,
on which host, by how much, and the likely cause:

- data wait: its time waiting for the next batch is the difference (loader workers, I/O, a slow disk);
- compute: its own computing is (a slower or throttled device, or CPU threads competing);
- binding: its CPUs are few or shared with another rank's (trainscale bind / the job's CPU layout).

A synchronous data-parallel step makes every rank wait for the slowest, so the step times of ranks
look alike; the per-rank data-wait and compute times (measured before the gradient all-reduce) are
what tell the slow rank apart. The verdict compares those "own" times.
"""

from __future__ import annotations

import json
import statistics
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from trainscale.observe.records import metrics_dir, note_event

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


def own_time(record: dict[str, Any]) -> float | None:
    """A rank's own work in a step: data wait + compute when recorded, else the whole step."""
    if "data_s" in record or "compute_s" in record:
        return float(record.get("data_s") or 0.0) + float(record.get("compute_s") or 0.0)
    return record.get("step_s")


def _cause(mine: list[dict], others: list[list[dict]], meta: dict, others_meta: list[dict]) -> str:
    def median(records: list[dict], key: str) -> float:
        values = [float(r[key]) for r in records if r.get(key) is not None]
        return statistics.median(values) if values else 0.0

    data, data_o = median(mine, "data_s"), statistics.median([median(o, "data_s") for o in others] or [0.0])
    comp, comp_o = median(mine, "compute_s"), statistics.median([median(o, "compute_s") for o in others] or [0.0])
    cpus = len(meta.get("cpus") or [])
    cpus_o = statistics.median([len(m.get("cpus") or []) for m in others_meta] or [0])
    if data - data_o > max(comp - comp_o, 0.0) and data > data_o:
        return (f"data wait ({data * 1e3:.1f} ms per step vs {data_o * 1e3:.1f} ms): its loader cannot keep up "
                "(DataLoader workers, I/O, a slow file system)")
    if cpus and cpus_o and cpus < cpus_o:
        return (f"CPU binding: it may use {cpus} CPU(s), the others {cpus_o:g} (trainscale bind shows the plan; "
                "check the job's CPU layout)")
    shared = set(meta.get("cpus") or []) & {c for m in others_meta if m.get("host") == meta.get("host")
                                            for c in (m.get("cpus") or [])}
    if shared:
        return f"CPU binding: it shares CPU(s) {sorted(shared)[:8]} with another rank of its node"
    return (f"compute ({comp * 1e3:.1f} ms per step vs {comp_o * 1e3:.1f} ms): a slower, throttled or busier device "
            "(nvidia-smi / rocm-smi on its node; trainscale attach JOBID --node HOST)")


def find_straggler(ranks: dict[int, list[dict]], *, ratio: float = DEFAULT_RATIO,
                   window: int = DEFAULT_WINDOW) -> Straggler | None:
    """Pure: the slowest rank over the last ``window`` steps every rank has, when it stands out by ``ratio``
    there and was the slowest by ``ratio`` in the ``window`` steps before too (a passing hiccup, another
    job's burst on a shared core, is not a straggler)."""
    steps = {r: [x for x in recs if x.get("kind") == "step" and own_time(x) is not None] for r, recs in ranks.items()}
    if len(steps) < 2 or any(len(s) < 2 * window for s in steps.values()):
        return None

    def slowest(chunk: dict[int, list[dict]]) -> tuple[int, float, float] | None:
        own = {r: statistics.median(own_time(x) for x in s) for r, s in chunk.items()}
        worst = max(own, key=own.get)
        others = statistics.median(v for r, v in own.items() if r != worst)
        return (worst, own[worst], others) if others > 0 and own[worst] / others >= ratio else None

    last = {r: s[-window:] for r, s in steps.items()}
    now = slowest(last)
    before = slowest({r: s[-2 * window:-window] for r, s in steps.items()})
    if now is None or before is None or now[0] != before[0]:
        return None
    worst, mine, others = now
    meta = {r: next((x for x in recs if x.get("kind") == "meta"), {}) for r, recs in ranks.items()}
    return Straggler(rank=worst, host=meta[worst].get("node") or meta[worst].get("host", "?"),
                     slower_by=mine / others - 1, own_s=mine, others_s=others,
                     cause=_cause(last[worst], [last[r] for r in last if r != worst], meta[worst],
                                  [meta[r] for r in meta if r != worst]))


class RankTail:
    """One rank's record file, read from where the last read stopped: its meta record and its last ``keep``
    steps with an own time. A line still being written is left for the next read."""

    def __init__(self, path: Path, keep: int) -> None:
        self.path, self.offset = path, 0
        self.meta: dict[str, Any] | None = None
        self.steps: deque[dict[str, Any]] = deque(maxlen=keep)

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            chunk = b""
        complete = chunk.rfind(b"\n") + 1
        for line in chunk[:complete].splitlines():
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("kind") == "meta" and self.meta is None:
                self.meta = record
            elif record.get("kind") == "step" and own_time(record) is not None:
                self.steps.append(record)
        self.offset += complete
        return ([self.meta] if self.meta else []) + list(self.steps)


class StragglerWatch:
    """Rank 0's side thread: every ``every_s`` seconds, read the ranks' records and name a straggler once."""

    def __init__(self, run_dir, *, say: Callable[[str], None], every_s: float = 10.0, ratio: float = DEFAULT_RATIO,
                 window: int = DEFAULT_WINDOW) -> None:
        self.run_dir, self.say, self.every_s = Path(run_dir), say, every_s
        self.ratio, self.window = ratio, window
        self.found: Straggler | None = None
        self.tails: dict[Path, RankTail] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trainscale-stragglers", daemon=True)

    def start(self) -> "StragglerWatch":
        self._thread.start()
        return self

    def check(self) -> Straggler | None:
        if self.found is not None:
            return None
        ranks = {int(p.stem.split("-", 1)[1]): self.tails.setdefault(p, RankTail(p, 2 * self.window)).read()
                 for p in metrics_dir(self.run_dir).glob("rank-*.jsonl")}
        found = find_straggler(ranks, ratio=self.ratio, window=self.window)
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
