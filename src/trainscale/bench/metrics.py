"""Let your own script report to ``trainscale bench`` (the same JSON the built-in workloads write).

    from trainscale.bench.metrics import EpochRecorder

    with trainscale.init() as rt:
        rec = EpochRecorder(rt)                  # path from TRAINSCALE_METRICS_OUT (set by bench)
        for epoch in range(epochs):
            rec.start()
            ... train ...
            rec.end(steps=steps, samples=steps * batch * rt.world_size, train_loss=loss, accuracy=acc)
        rec.write()                              # rank 0 writes; nothing happens outside bench

Without it, ``trainscale bench SCRIPT`` times the whole launch (start-up included).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

METRICS_ENV = "TRAINSCALE_METRICS_OUT"


class EpochRecorder:
    def __init__(self, runtime, path: str | os.PathLike | None = None) -> None:
        self.runtime = runtime
        raw = path if path is not None else os.environ.get(METRICS_ENV)
        self.path = Path(raw) if raw else None
        self.epochs: list[dict] = []
        self._t0: float | None = None

    def start(self) -> None:
        self._t0 = time.perf_counter()

    def end(self, *, steps: int, samples: int, train_loss: float | None = None, test_loss: float | None = None,
            accuracy: float | None = None, breakdown: dict | None = None) -> dict:
        """Close the epoch started by ``start()``; the time is the mean over ranks."""
        if self._t0 is None:
            raise RuntimeError("EpochRecorder.end() without start()")
        seconds = self.runtime.mean(time.perf_counter() - self._t0)
        self._t0 = None
        record = {"epoch": len(self.epochs) + 1, "steps": int(steps), "samples": int(samples), "time_s": seconds,
                  "samples_per_s": samples / seconds if seconds > 0 else None, "train_loss": train_loss,
                  "test_loss": test_loss, "accuracy": accuracy, "breakdown": breakdown}
        self.epochs.append(record)
        return record

    def write(self, **extra) -> Path | None:
        if self.path is None or not self.runtime.is_main:
            return None
        data = {"world_size": self.runtime.world_size, "num_nodes": self.runtime.num_nodes,
                "device": str(self.runtime.device), "epochs": self.epochs,
                "train_time_s": sum(e["time_s"] for e in self.epochs), **extra}
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(data, indent=2))
        os.replace(tmp, self.path)
        return self.path
