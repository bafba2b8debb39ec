"""What a run records about itself, in an open format: JSON lines, one file per rank and per node.

    <run dir>/metrics/rank-<R>.jsonl    {"kind": "meta" | "step" | "epoch" | "summary", ...}
    <run dir>/metrics/node-<host>.jsonl {"kind": "sample", ...} from the device sampler (observe/sampler.py)
    <run dir>/metrics/events.jsonl      {"kind": "straggler" | "interconnect", ...} said while training

Each record's fields: docs/observability.md. Lines are buffered and written in blocks (every ``flush_every``
records or ``flush_after_s`` seconds, and at close), so recording costs no I/O on most steps and no
collective ever. Where the rank is one of a process group, it also keeps a summary of its last steps for
rank 0's straggler watch and puts it in the group's store at most every half second (observe/window.py):
rank 0 then reads no rank's file.
"""

from __future__ import annotations

import json
import math
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from trainscale.env import node_name
from trainscale.observe.window import Publisher, RankWindow, default_store
from trainscale.topology.apply import current_affinity

METRICS = "metrics"


def metrics_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / METRICS


_ENCODE = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
"""Made once: ``json.dumps`` with arguments builds an encoder per call."""


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


class JsonLines:
    """An append-only JSON-lines file written in blocks (never a half line: one write per block)."""

    def __init__(self, path: Path, flush_every: int = 50, flush_after_s: float = 5.0) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.flush_every = max(1, flush_every)
        self.flush_after_s = flush_after_s
        self._pending: list[str] = []
        self._flushed = time.monotonic()
        self._lock = threading.Lock()  # the heartbeat flushes a stalled rank's records from its own thread

    def write(self, record: dict[str, Any]) -> None:
        try:  # a record without NaN or infinity (nearly all) is written as it is: no walk over its values first
            line = _ENCODE(record)
        except ValueError:
            line = json.dumps(_clean(record), separators=(",", ":"))
        with self._lock:
            self._pending.append(line)
        if len(self._pending) >= self.flush_every or time.monotonic() - self._flushed >= self.flush_after_s:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            self._flushed = time.monotonic()
            if not self._pending:
                return
            block = "\n".join(self._pending) + "\n"
            self._pending.clear()
            with open(self.path, "a") as fh:
                fh.write(block)

    def close(self) -> None:
        self.flush()


class RankRecorder:
    """One rank's metrics stream: a line per step, a file write every ``flush_every`` lines. The recorder
    (observe/hooks.py) writes its steps from its flushing thread, off the training loop.

    ``store``: where the summary for the straggler watch goes; "auto" (default) is the process group's
    when this process is one of two or more ranks, None keeps it to the files."""

    def __init__(
        self,
        run_dir: str | Path,
        rank: int,
        *,
        flush_every: int = 50,
        flush_after_s: float = 5.0,
        store: Any = "auto",
        window: int = 20,
        **meta: Any,
    ) -> None:
        self.rank = rank
        self.out = JsonLines(metrics_dir(run_dir) / f"rank-{rank}.jsonl", flush_every, flush_after_s)
        first = {
            "kind": "meta",
            "rank": rank,
            "host": socket.gethostname(),
            "node": node_name(),
            "pid": os.getpid(),
            "t": time.time(),
            "cpus": sorted(current_affinity()),
            **meta,
        }
        self.out.write(first)
        self.out.flush()  # the meta line at once: a reader learns of the rank before its first block
        self.window = RankWindow(window, first)
        self.publisher = Publisher(default_store() if store == "auto" else store, rank, self.window)

    def step(self, step: int, step_s: float, t: float | None = None, **fields: float | int | None) -> None:
        """``t``: when the step ended (now if not given)."""
        record = {
            "kind": "step",
            "step": step,
            "t": time.time() if t is None else t,
            "step_s": step_s,
            **{k: v for k, v in fields.items() if v is not None},
        }
        self.out.write(record)
        self.window.add(record)
        self.publisher.maybe()

    def epoch(self, epoch: int, **fields: Any) -> None:
        self.out.write({"kind": "epoch", "epoch": epoch, "t": time.time(), **fields})
        self.out.flush()

    def summary(self, **fields: Any) -> None:
        self.out.write({"kind": "summary", "t": time.time(), **fields})
        self.out.flush()

    def close(self) -> None:
        self.out.close()
        self.publisher.maybe(force=True)


def read_lines(path: Path) -> Iterator[dict[str, Any]]:
    """The records of one file; a line cut by a crash (the last one) is skipped."""
    try:
        with open(path) as fh:
            for line in fh:
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        return


def read_run(run_dir: str | Path) -> dict[str, Any]:
    """Everything a run recorded: {"ranks": {R: [records]}, "nodes": {host: [samples]}, "events": [...]}."""
    root = metrics_dir(run_dir)
    ranks = {int(path.stem.split("-", 1)[1]): list(read_lines(path)) for path in root.glob("rank-*.jsonl")}
    nodes = {path.stem.split("-", 1)[1]: list(read_lines(path)) for path in sorted(root.glob("node-*.jsonl"))}
    return {"ranks": dict(sorted(ranks.items())), "nodes": nodes, "events": list(read_lines(root / "events.jsonl"))}


def note_event(run_dir: str | Path, **fields: Any) -> None:
    """One line in events.jsonl, written at once (events are rare: a straggler named, a transport found)."""
    out = JsonLines(metrics_dir(run_dir) / "events.jsonl", flush_every=1)
    out.write({"t": time.time(), **fields})
