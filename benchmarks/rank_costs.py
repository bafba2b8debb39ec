"""What trainscale's own additions cost per rank: each one timed on simulated run directories of 8 … 1,024 ranks.

    .venv/bin/python benchmarks/rank_costs.py [--sizes 8,64,256,1024] [--steps 1000] [--repeats 3]

For each size it writes what a long run leaves behind (observe/records.py, observe/sampler.py, launch/):
every rank's step records (``--steps`` of them, the loop's real line format), one sampler file per node
(8 ranks per node, ``--samples`` samples), every rank's log (``--log-lines`` lines), and a failure: the
first rank of node 11 raises, every other rank then dies of the closed connection, each leaving its error
file, as a job in srun mode (``rank-R.out``, ``errors/``) and one in torchrun mode (``node-K.out`` with
the agents' summaries, ``torchrun/.../error.json``). A sweep of as many tasks as ranks goes beside it.
Then it times, median of ``--repeats``:

- the straggler watch's tick on rank 0 (every 10 s while training): reading every rank's summary from a
  real TCPStore (as in a process group), and what the store serves when every rank publishes; without a
  store, reading the record files: after every rank wrote one more block of steps, and its first look
  (a watch that starts on a long run's files);
- the failure triage after the job (`trainscale jobs JOBID`, the watcher's explanation), both modes;
- one rank's log (`trainscale jobs JOBID --rank R`), torchrun mode (the node logs hold it);
- the report: gather (read the run) and render (text, HTML and plots);
- `trainscale sweep status` over a sweep of N tasks;
- the launcher's end-of-run summary (torchelastic's failure records -> the text naming the first).

Each row also says how many bytes the operation read (``rchar`` of /proc/self/io): an operation whose
bytes grow with the run's history or with every rank's log, where it needs only new lines or a tail, is
one that will not scale. Files are read from the page cache here; a parallel file system adds per-file
latency, so the files opened per operation matter more there than the seconds measured here.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from _common import load

RANKS_PER_NODE = 8
FAIL_NODE = 11
"""The failing rank is the first on this node (1-based, as SLURM names n11)."""
TICK_BUDGET_S = 0.1
"""1% of the straggler watch's 10 s period."""


# ----------------------------------------------------------------------------------------------- generate
def _step_line(step: int, t: float, rng: random.Random, slow: bool) -> str:
    data = 0.0002 + rng.random() * 0.0001 + (0.02 if slow else 0.0)
    comp = 0.013 + rng.random() * 0.002
    return (
        f'{{"kind":"step","step":{step},"t":{t:.7f},"step_s":{0.06 + rng.random() * 0.01:.17f},"samples":16,'
        f'"data_s":{data:.17f},"compute_s":{comp:.17f},"backward_s":{0.028 + rng.random() * 0.01:.17f},'
        f'"optimizer_s":{0.011 + rng.random() * 0.002:.17f}}}\n'
    )


def _meta_line(rank: int, world: int, node: str) -> str:
    local = rank % RANKS_PER_NODE
    return (
        json.dumps(
            {
                "kind": "meta",
                "rank": rank,
                "host": node,
                "node": node,
                "pid": 10000 + rank,
                "t": 1.7e9,
                "cpus": [local * 7 + c for c in range(7)],
                "world_size": world,
                "device": f"cuda:{local}",
                "backend": "nccl",
                "threads": 7,
                "workload": "gpt",
                "strategy": "ddp",
                "batch_size": 16,
                "accumulation": 1,
            },
            separators=(",", ":"),
        )
        + "\n"
    )


def _epoch_line(epoch: int) -> str:
    return (
        json.dumps(
            {
                "kind": "epoch",
                "epoch": epoch,
                "t": 1.7e9 + epoch,
                "time_s": 100.0,
                "samples_per_s": 464.5,
                "train_loss": 1.2,
                "test_loss": 0.05,
                "accuracy": 1.0,
                "ddp": {
                    "forward_s": 0.018,
                    "backward_compute_s": 0.037,
                    "comm_s": 0.027,
                    "overlap_s": 0.026,
                    "exposed_comm_s": 0.0013,
                    "buckets": 2,
                },
            },
            separators=(",", ":"),
        )
        + "\n"
    )


def _sample_line(t: float, first: int, rng: random.Random) -> str:
    procs = [
        {"pid": 10000 + first + i, "cpu_pct": round(90 + rng.random() * 10, 1), "rss": 3_800_000_000}
        for i in range(RANKS_PER_NODE)
    ]
    gpus = [
        {"index": i, "rank": first + i, "util_pct": 95.0, "mem_used": 60_000_000_000, "power_w": 400.0}
        for i in range(RANKS_PER_NODE)
    ]
    return (
        json.dumps(
            {
                "kind": "sample",
                "t": t,
                "cpu_pct": 93.1,
                "procs": procs,
                "rank_cpus": 56,
                "rank_cpus_busy_pct": 5300.0,
                "gpus": gpus,
            },
            separators=(",", ":"),
        )
        + "\n"
    )


def node_of(rank: int) -> str:
    return f"nid{rank // RANKS_PER_NODE + 1:05d}"


def _error_json(text: str) -> str:
    return json.dumps(
        {"message": {"message": text.splitlines()[-1], "extraInfo": {"py_callstack": text, "timestamp": "1700000000"}}}
    )


PRIMARY_TB = """Traceback (most recent call last):
  File "/scratch/proj/train.py", line 88, in <module>
    main()
  File "/scratch/proj/train.py", line 61, in main
    loss = step(batch)
  File "/scratch/proj/train.py", line 40, in step
    raise RuntimeError("CUDA error: an illegal memory access was encountered")
RuntimeError: CUDA error: an illegal memory access was encountered
"""
SECONDARY_TB = """Traceback (most recent call last):
  File "/scratch/proj/train.py", line 88, in <module>
    main()
  File "/scratch/proj/train.py", line 62, in main
    loss.backward()
RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.1]:29500
"""


class Run:
    """One simulated run directory of ``ranks`` ranks and its two failed jobs (srun 100, torchrun 200)."""

    def __init__(self, root: Path, ranks: int, *, steps: int, samples: int, log_lines: int) -> None:
        self.root, self.ranks, self.steps = root, ranks, steps
        self.nodes = max(1, ranks // RANKS_PER_NODE)
        self.first = min(ranks - 1, (FAIL_NODE - 1) * RANKS_PER_NODE) if self.nodes >= FAIL_NODE else ranks // 2
        self.run_dir = root / "run"
        self.metrics = self.run_dir / "metrics"
        self.metrics.mkdir(parents=True)
        rng = random.Random(ranks)
        t0 = 1.7e9
        for rank in range(ranks):
            node = node_of(rank)
            lines = [_meta_line(rank, ranks, node)]
            lines += [_step_line(s, t0 + s * 0.07, rng, rank == 3) for s in range(steps)]
            lines += [_epoch_line(e) for e in range(1, 4)]
            (self.metrics / f"rank-{rank}.jsonl").write_text("".join(lines))
        for n in range(self.nodes):
            (self.metrics / f"node-{node_of(n * RANKS_PER_NODE)}.jsonl").write_text(
                "".join(_sample_line(t0 + 5 * i, n * RANKS_PER_NODE, rng) for i in range(samples))
            )
        (self.metrics / "events.jsonl").write_text("")
        self.log_lines = log_lines
        self.srun_job = self._srun_job()
        self.torchrun_job = self._torchrun_job()
        self.sweep = self._sweep()

    def _rank_log(self, rank: int) -> str:
        return "".join(
            f"step {i}: loss 0.{i % 997:04d} lr 3e-4 throughput 1234.5 samples/s on rank {rank}\n"
            for i in range(self.log_lines)
        )

    def _failed_ranks(self) -> list[int]:
        """The root cause first, then every other rank (each died of the closed connection)."""
        return [self.first] + [r for r in range(self.ranks) if r != self.first]

    def _srun_job(self) -> Path:
        job = self.run_dir / "100"
        (job / "errors").mkdir(parents=True)
        for rank in range(self.ranks):
            tb = PRIMARY_TB if rank == self.first else SECONDARY_TB
            (job / f"rank-{rank}.out").write_text(self._rank_log(rank) + tb)
        t = time.time() - 60
        for k, rank in enumerate(self._failed_ranks()):  # written in this order, as the ranks died
            path = job / "errors" / f"error-rank{rank}.json"
            path.write_text(_error_json(PRIMARY_TB if rank == self.first else SECONDARY_TB))
            os.utime(path, ns=(int((t + k * 0.001) * 1e9),) * 2)
        batch = [f"trainscale: job 100 on nid[00001-{self.nodes:05d}], master nid00001:29500\n"]
        batch.append(f"srun: error: {node_of(self.first)}: task {self.first}: Exited with exit code 1\n")
        batch += [
            f"srun: error: {node_of(r)}: task {r}: Exited with exit code 1\n"
            for r in range(self.ranks)
            if r != self.first
        ]
        (self.run_dir / "100.out").write_text("".join(batch))
        return job

    def _torchrun_job(self) -> Path:
        from trainscale.launch import summary

        job = self.run_dir / "200"
        job.mkdir(parents=True)
        t = time.time() - 60
        for n in range(self.nodes):
            local = range(n * RANKS_PER_NODE, min(self.ranks, (n + 1) * RANKS_PER_NODE))
            attempt = job / "torchrun" / f"200_node{n}" / "attempt_0"
            lines = []
            for rank in local:
                lines += [f"[rank{rank}]: {line}\n" for line in self._rank_log(rank).splitlines()]
            failures = []
            for rank in local:
                d = attempt / str(rank % RANKS_PER_NODE)
                d.mkdir(parents=True)
                tb = PRIMARY_TB if rank == self.first else SECONDARY_TB
                (d / "stdout.log").write_text(self._rank_log(rank))
                (d / "stderr.log").write_text(tb)
                (d / "error.json").write_text(_error_json(tb))
                k = self._failed_ranks().index(rank)
                os.utime(d / "error.json", ns=(int((t + k * 0.001) * 1e9),) * 2)
                failures.append(
                    summary.RankFailure(
                        rank=rank,
                        local_rank=rank % RANKS_PER_NODE,
                        host=node_of(rank),
                        pid=10000 + rank,
                        exitcode=1,
                        timestamp=t + k * 0.001,
                        traceback=tb,
                        log_tail="",
                    )
                )
            failures.sort(key=lambda f: (f.secondary, f.timestamp, f.rank))
            text = summary.render(failures, world_size=self.ranks, log_dir=attempt.parent)
            (job / f"node-{n}.out").write_text("".join(lines) + text + "\n")  # srun's %n: the node's index
        (self.run_dir / "200.out").write_text(
            f"trainscale: job 200 on nid[00001-{self.nodes:05d}], master nid00001:29500, restart 0\n"
        )
        return job

    def _sweep(self) -> Path:
        sweep = self.root / "sweep"
        sweep.mkdir()
        configs = [
            {"lr": f"{1e-3 / (1 + i % 7):.2e}", "batch_size": str(16 << (i % 4)), "seed": str(i)}
            for i in range(self.ranks)
        ]
        (sweep / "sweep.json").write_text(json.dumps({"grid": {}, "configurations": configs, "jobs": ["300"]}))
        for i in range(self.ranks):
            task = sweep / f"task-{i}"
            task.mkdir()
            (task / ("finished" if i % 10 else "failed")).write_text("done\n")
            epochs = [
                {
                    "epoch": e,
                    "train_loss": 1.0 / (e + i % 13 + 1),
                    "test_loss": 1.1 / (e + i % 11 + 1),
                    "accuracy": 0.9,
                    "samples_per_s": 1000.0 + i,
                }
                for e in range(1, 4)
            ]
            (task / "metrics.json").write_text(json.dumps({"steps": 300, "epochs": epochs}))
        return sweep

    def append_block(self, lines_per_rank: int = 50) -> None:
        """Every rank flushes one more block of step records (the recorder's default: 50 lines)."""
        rng = random.Random(self.steps)
        for rank in range(self.ranks):
            with open(self.metrics / f"rank-{rank}.jsonl", "a") as fh:
                fh.write("".join(_step_line(self.steps + i, 1.8e9 + i, rng, rank == 3) for i in range(lines_per_rank)))
        self.steps += lines_per_rank

    def bytes(self) -> int:
        return sum(p.stat().st_size for p in self.run_dir.rglob("*") if p.is_file())


# -------------------------------------------------------------------------------------------------- time
def rchar() -> int:
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def timed(fn: Callable[..., Any], repeats: int, setup: Callable[[], Any] | None = None) -> tuple[float, int]:
    """(median seconds, bytes read by one call); ``setup``'s result, unless None, is handed to ``fn``."""
    times, read = [], 0
    for _ in range(repeats):
        state = setup() if setup else None
        r0, t0 = rchar(), time.perf_counter()
        fn() if state is None or state == 0 else fn(state)
        times.append(time.perf_counter() - t0)
        read = rchar() - r0
    return statistics.median(times), read


def measure(run: Run, repeats: int) -> dict[str, tuple[float, int]]:
    from trainscale.launch.slurm.jobdir import JobRecord, rank_log_text
    from trainscale.launch.slurm.sweep import choose_metric, ranked, table, write_results
    from trainscale.launch.slurm.sweep import gather as sweep_gather
    from trainscale.launch.slurm.sweep import plot as sweep_plot
    from trainscale.launch.slurm.triage import find_failure
    from trainscale.report import gather, render_text, write_report

    out: dict[str, tuple[float, int]] = {}
    out.update(store_ticks(run, repeats))
    out["straggler tick (files, 1st look)"] = timed(lambda w: w.check(), repeats, lambda: cold_watch(run))
    out["straggler tick (files, 50 new lines/rank)"] = file_tick(run, repeats)
    srun_out = (run.run_dir / "100.out").read_text()

    def triage(job: Path, launcher: str, text: str) -> None:
        failure = find_failure(job, launcher, text)
        assert failure is not None and failure.rank == run.first, (launcher, failure)

    out["triage, srun mode"] = timed(lambda: triage(run.srun_job, "srun", srun_out), repeats)
    out["triage, torchrun mode"] = timed(lambda: triage(run.torchrun_job, "torchrun", ""), repeats)
    record = JobRecord(
        job_id="200",
        name="sim",
        launcher="torchrun",
        profile="sim",
        script="",
        output_dir="",
        world_size=run.ranks,
        ranks_per_node=RANKS_PER_NODE,
        run_dir=str(run.run_dir),
    )
    out["jobs JOB --rank R, torchrun mode"] = timed(lambda: rank_log_text(record, run.first), repeats)
    out["report gather"] = timed(lambda: gather(str(run.run_dir)), repeats)
    g = gather(str(run.run_dir))
    report_dir = run.root / "report"
    out["report render (text)"] = timed(lambda: render_text(g), repeats)
    out["report render (HTML + plots)"] = timed(lambda: write_report(g, report_dir), repeats)

    def sweep_status() -> None:
        results = sweep_gather(run.sweep)
        metric = choose_metric(results, None)
        header, rows = table(ranked(results, metric), metric)
        write_results(run.sweep, header, rows)
        sweep_plot(run.sweep, results, metric)

    out["sweep status"] = timed(sweep_status, repeats)
    out["end-of-run summary"] = summary_cost(run, repeats)
    return out


def cold_watch(run: Run):
    """A watch without a store: it reads the record files (first look: the ends of a long run's files)."""
    from trainscale.observe.stragglers import StragglerWatch

    return StragglerWatch(run.run_dir, say=lambda text: None, store=None)


def file_tick(run: Run, repeats: int) -> tuple[float, int]:
    """The file-reading watch's tick once running: every rank has written one more block since the last."""
    watch = cold_watch(run)
    watch.check()
    times, read = [], 0
    for _ in range(repeats):
        run.append_block()
        watch.found = None  # look again in full (the straggler was named on the first tick)
        r0, t0 = rchar(), time.perf_counter()
        watch.check()
        times.append(time.perf_counter() - t0)
        read = rchar() - r0
    return statistics.median(times), read


def store_ticks(run: Run, repeats: int) -> dict[str, tuple[float, int]]:
    """Rank 0's tick as it runs in a process group: every rank publishes its window summary to a real
    TCPStore (here one client plays all of them), the watch reads them all; and what the store serves when
    every rank publishes once (at most every half second)."""
    import datetime

    from trainscale.observe.stragglers import StragglerWatch
    from trainscale.observe.window import KEY, Publisher, RankWindow
    from trainscale.runtime.store import bound_server, client

    timeout = datetime.timedelta(seconds=60)
    server = bound_server("127.0.0.1", 0, timeout)
    ranks = client("127.0.0.1", server.port, timeout)
    rng = random.Random(run.ranks)
    publishers = []
    for rank in range(run.ranks):
        window = RankWindow(20, {"node": node_of(rank), "cpus": list(range(rank % 8 * 7, rank % 8 * 7 + 7))})
        for s in range(40):
            window.add(json.loads(_step_line(s, 0.0, rng, rank == 3)))
        publishers.append(Publisher(ranks, rank, window))
    watch = StragglerWatch(
        run.run_dir, say=lambda text: None, store=client("127.0.0.1", server.port, timeout), world_size=run.ranks
    )

    last = [KEY.format(rank=run.ranks - 1)]

    def publish_all() -> None:
        for p in publishers:
            p.maybe(force=True)
        # TCPStore answers no set: a request after them on the same connection returns once the server has
        # applied them all (without it the watch's connection could look first, and the time is the sends')
        assert ranks.check(last)

    out = {"store: every rank publishes once": timed(publish_all, repeats)}

    def look() -> None:
        watch.found = None
        assert watch.check() is not None  # rank 3 is slow: named from the store

    out["straggler tick (store)"] = timed(look, repeats, setup=lambda: publish_all() or 0)
    return out


def summary_cost(run: Run, repeats: int) -> tuple[float, int]:
    """The launcher's summary when every rank of one agent failed (the first raised, the others died of it)."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from trainscale.launch import summary

    attempt = run.root / "local" / "attempt_0"
    failures, logs = {}, {}
    for rank in run._failed_ranks():
        d = attempt / str(rank)
        d.mkdir(parents=True)
        tb = PRIMARY_TB if rank == run.first else SECONDARY_TB
        (d / "error.json").write_text(_error_json(tb))
        (d / "stderr.log").write_text(run._rank_log(rank) + tb)
        failures[rank] = ProcessFailure(local_rank=rank, pid=10000 + rank, exitcode=1, error_file=str(d / "error.json"))
        logs[rank] = d / "stderr.log"
    error = ChildFailedError("train.py", failures)

    def once() -> str:
        text = summary.render(summary.from_child_failed(error, logs), world_size=run.ranks, log_dir=attempt)
        assert f"first failing rank: {run.first} " in text, text[:400]
        return text

    took = timed(once, repeats)
    lines = once().count("\n") + 1
    print(f"    (summary at {run.ranks} ranks: {lines} lines)", flush=True)
    return took


# ------------------------------------------------------------------------------------------------- print
def main() -> None:
    import warnings

    warnings.filterwarnings("ignore", module="matplotlib")  # "legend with loc='best' can be slow": it is measured
    warnings.filterwarnings("ignore", message=".*(legend|[Tt]ight layout).*")
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="8,64,256,1024")
    p.add_argument("--steps", type=int, default=1000, help="step records per rank already written (the history)")
    p.add_argument("--samples", type=int, default=720, help="sampler records per node (720: an hour at 5 s)")
    p.add_argument("--log-lines", type=int, default=1000, help="lines in each rank's log")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--keep", action="store_true", help="keep the generated directories (printed)")
    a = p.parse_args()
    sizes = [int(s) for s in a.sizes.split(",")]
    results: dict[int, dict[str, tuple[float, int]]] = {}
    data: dict[int, int] = {}
    print(
        f"rank_costs: {a.steps} steps/rank, {a.samples} samples/node, {a.log_lines} log lines/rank, "
        f"{RANKS_PER_NODE} ranks/node, median of {a.repeats}; {load()}",
        flush=True,
    )
    warm = Path(tempfile.mkdtemp(prefix="ts-rank-costs-warm-"))
    measure(Run(warm, 8, steps=100, samples=10, log_lines=10), 1)  # imports and caches: not the cost of a size
    shutil.rmtree(warm, ignore_errors=True)
    for n in sizes:
        root = Path(tempfile.mkdtemp(prefix=f"ts-rank-costs-{n}-"))
        t0 = time.perf_counter()
        run = Run(root, n, steps=a.steps, samples=a.samples, log_lines=a.log_lines)
        data[n] = run.bytes()
        print(
            f"  {n} ranks: generated {data[n] / 2**20:.0f} MiB in {time.perf_counter() - t0:.0f}s ({root})", flush=True
        )
        results[n] = measure(run, a.repeats)
        for name, (s, b) in results[n].items():
            print(f"    {name:<38} {s * 1e3:9.1f} ms  {b / 2**20:8.1f} MiB read", flush=True)
        if not a.keep:
            shutil.rmtree(root, ignore_errors=True)
    print_table(sizes, results, data)


def print_table(sizes: list[int], results: dict[int, dict[str, tuple[float, int]]], data: dict[int, int]) -> None:
    names = list(results[sizes[0]])
    lo, hi = sizes[0], sizes[-1]
    print("\n| operation | " + " | ".join(f"{n} ranks" for n in sizes) + f" | time x ({lo}->{hi}) | read x |")
    print("|---|" + "---|" * len(sizes) + "---|---|")
    for name in names:
        cells = [f"{results[n][name][0] * 1e3:.1f} ms ({results[n][name][1] / 2**20:.1f} MiB)" for n in sizes]
        t = results[hi][name][0] / max(results[lo][name][0], 1e-9)
        b = results[hi][name][1] / max(results[lo][name][1], 1)
        print(f"| {name} | " + " | ".join(cells) + f" | {t:.0f}x | {b:.0f}x |")
    print(
        "| (run directory) | "
        + " | ".join(f"{data[n] / 2**20:.0f} MiB" for n in sizes)
        + f" | | {data[hi] / data[lo]:.0f}x |"
    )
    tick = results[hi]["straggler tick (store)"][0]
    print(
        f"\nstraggler tick at {hi} ranks: {tick * 1e3:.1f} ms = {tick / 10:.2%} of its 10 s period "
        f"(goal < 1%: {'met' if tick < TICK_BUDGET_S else 'missed'}); {load()}"
    )


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
