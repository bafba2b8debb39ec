"""Device sampling in a side thread, one per node (in local rank 0): utilisation, memory and power of the
job's own GPUs through NVML (nvidia-ml-py) or AMD SMI (amdsmi) when present (observe/devices.py: the
devices the node's ranks published, labelled by rank), and always the CPU use and resident
memory of each of the node's ranks (psutil), and how busy the CPUs they may run on were: what the
ranks did not use of that was other work sharing their cores (:func:`other_cpu_share`). Written to
``metrics/node-<host>.jsonl``.

The node's ranks are this process and its siblings (the children of the same parent: torchrun's
agent, or srun's slurmstepd) that run the same program. ``TRAINSCALE_SAMPLE_INTERVAL`` seconds between
samples (default 5); 0 switches sampling off.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any

from trainscale.env import node_name
from trainscale.observe.records import JsonLines, metrics_dir

INTERVAL_VAR = "TRAINSCALE_SAMPLE_INTERVAL"
DEFAULT_INTERVAL_S = 5.0


def interval_from_env(environ=os.environ) -> float:
    raw = environ.get(INTERVAL_VAR, "")
    try:
        return max(0.0, float(raw)) if raw else DEFAULT_INTERVAL_S
    except ValueError:
        return DEFAULT_INTERVAL_S


def node_ranks() -> list[Any]:
    """psutil Processes of this node's ranks: this one and its siblings running the same program."""
    import psutil  # noqa: PLC0415 (job kit)

    me = psutil.Process()
    try:
        parent, mine = me.parent(), _program(me.cmdline())
        siblings = [
            p for p in (parent.children() if parent else []) if p.pid != me.pid and _program(p.cmdline()) == mine
        ]
    except psutil.Error:
        siblings = []
    return [me, *siblings]


def _program(cmdline: list[str]) -> list[str]:
    """A command line without what differs between the processes of one ``torch.multiprocessing.spawn`` (the
    script's own ranks: ``spawn_main(tracker_fd=7, pipe_handle=12)``, each its own pipe)."""
    return [re.sub(r"spawn_main\(.*?\)", "spawn_main()", part) for part in cmdline]


def rank_cpus(procs: list[Any]) -> list[int]:
    """The CPUs the node's ranks may run on (the union of their affinities)."""
    import psutil  # noqa: PLC0415 (job kit)

    cpus: set[int] = set()
    for p in procs:
        try:
            cpus.update(p.cpu_affinity())
        except (psutil.Error, AttributeError):  # no affinity on this platform: every CPU
            return list(range(psutil.cpu_count() or 1))
    return sorted(cpus)


OTHER_WORK_SHARE = 0.10
"""Share of the ranks' CPUs other work may keep busy before a run counts as disturbed (its figures carry *,
the plan's check leaves it out, the report names it). Measured on a quiet 2-core host: 0.002-0.02 over 18 runs; a test
suite beside a study: 0.25; `yes`: 0.35."""


def other_cpu_share(samples: list[dict[str, Any]]) -> float | None:
    """The share of the ranks' CPUs that other work kept busy, averaged over the samples: their busy time
    minus the ranks' own (None: no sample says). Another job, a compile or a test run on the same cores
    slows every rank down, and no model of the training predicts that."""
    shares = []
    for x in samples:
        cpus, busy = x.get("rank_cpus"), x.get("rank_cpus_busy_pct")
        if not cpus or busy is None:
            continue
        ranks = sum(p.get("cpu_pct") or 0.0 for p in x.get("procs", []))
        shares.append(min(1.0, max(0.0, (busy - ranks) / (100.0 * cpus))))
    return sum(shares) / len(shares) if shares else None


class Sampler:
    """Samples every ``interval_s`` in a daemon thread until :meth:`stop`."""

    def __init__(
        self, run_dir, *, interval_s: float, gpu_reader: Callable[[], list[dict]] | None = None, local_ranks: int = 1
    ) -> None:
        import psutil  # noqa: PLC0415 (job kit)

        from trainscale.observe.devices import JobGpus  # noqa: PLC0415 (job kit)

        self.interval_s = interval_s
        host = node_name()
        self.out = JsonLines(metrics_dir(run_dir) / f"node-{host}.jsonl", flush_every=1)
        self.gpu = gpu_reader if gpu_reader is not None else JobGpus(run_dir, host, local_ranks)
        self.procs = node_ranks()
        self.cpus = rank_cpus(self.procs)
        for p in self.procs:
            p.cpu_percent(None)  # the first reading only starts psutil's clock
        psutil.cpu_percent(None)
        psutil.cpu_percent(None, percpu=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trainscale-sampler", daemon=True)
        self.samples = 0

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def sample(self) -> dict[str, Any]:
        import psutil  # noqa: PLC0415 (job kit)

        procs = []
        for p in self.procs:
            try:
                with p.oneshot():
                    procs.append({"pid": p.pid, "cpu_pct": p.cpu_percent(None), "rss": p.memory_info().rss})
            except psutil.Error:
                continue
        per_cpu = psutil.cpu_percent(None, percpu=True)
        record = {
            "kind": "sample",
            "t": time.time(),
            "cpu_pct": psutil.cpu_percent(None),
            "procs": procs,
            "rank_cpus": len(self.cpus),
            "rank_cpus_busy_pct": sum(per_cpu[i] for i in self.cpus if i < len(per_cpu)),
        }
        try:
            gpus = self.gpu()
        except Exception as exc:  # a driver hiccup must not end training
            record["gpu_error"] = str(exc)
        else:
            if gpus:
                record["gpus"] = gpus
        self.out.write(record)
        self.samples += 1
        return record

    def _loop(self) -> None:
        # psutil keeps the system-wide readings' last sample per thread: the first reading in a thread
        # covers no interval and says 0%, so this thread takes one before its first wait
        import psutil  # noqa: PLC0415 (job kit)

        psutil.cpu_percent(None)
        psutil.cpu_percent(None, percpu=True)
        while not self._stop.wait(self.interval_s):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 5)
        self.out.close()


def start_sampler(run_dir, *, local_rank: int, local_ranks: int = 1, environ=os.environ) -> Sampler | None:
    """One sampler per node (local rank 0), unless sampling is off (interval 0)."""
    interval = interval_from_env(environ)
    if local_rank != 0 or interval <= 0:
        return None
    return Sampler(run_dir, interval_s=interval, local_ranks=local_ranks).start()
