"""The failure triage of a 64-rank job (8 nodes x 8) in both launch modes: the first failing rank named with
its traceback, the 63 others in one line per way of failing, and only the ends of the (long) logs read; and
one rank's log in torchrun mode read from its own node's log only."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from trainscale.launch import summary
from trainscale.launch.slurm.jobdir import JobRecord, rank_log_text
from trainscale.launch.slurm.triage import find_failure

RANKS, PER_NODE, FIRST = 64, 8, 43
FIRST_TB = (
    'Traceback (most recent call last):\n  File "/home/u/train.py", line 9, in <module>\n'
    '    raise RuntimeError("boom on 43")\nRuntimeError: boom on 43\n'
)
PEER_TB = "Traceback (most recent call last):\nRuntimeError: Connection closed by peer [10.0.0.1]:29500\n"
LOG = "".join(f"step {i}: loss 0.{i:05d} throughput 1234.5 samples/s\n" for i in range(20000))  # ~0.9 MB a rank


def node(rank: int) -> str:
    return f"n{rank // PER_NODE + 1}"


def error_file(path: Path, tb: str, at_ns: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"message": {"message": tb.splitlines()[-1], "extraInfo": {"py_callstack": tb}}}))
    os.utime(path, ns=(at_ns, at_ns))


def order() -> list[int]:
    return [FIRST] + [r for r in range(RANKS) if r != FIRST]


def rchar() -> int:
    return int(
        next(line for line in Path("/proc/self/io").read_text().splitlines() if line.startswith("rchar:")).split()[1]
    )


def test_srun_mode_at_64_ranks(tmp_path):
    job = tmp_path / "job"
    t = time.time_ns() - 10**10
    for k, rank in enumerate(order()):  # the first raised, then every other rank lost its peer
        error_file(job / "errors" / f"error-rank{rank}.json", FIRST_TB if rank == FIRST else PEER_TB, t + k * 10**6)
        (job / f"rank-{rank}.out").write_text(LOG + "the last line\n")
    batch = "".join(
        f"srun: error: {node(r)}: task {r}: {'Exited with exit code 1' if r == FIRST else 'Terminated'}\n"
        for r in order()
    )
    before = rchar()
    failure = find_failure(job, "srun", batch)
    read = rchar() - before
    text = failure.describe()
    assert (failure.rank, failure.host) == (FIRST, "n6") and "RuntimeError: boom on 43" in text, text
    assert failure.others == ("ranks 0-42,44-63 on 8 nodes: Terminated",), failure.others
    assert failure.log_tail.endswith("the last line") and read < 256 * 1024, read  # not the 0.9 MB log


def test_torchrun_mode_at_64_ranks(tmp_path):
    job = tmp_path / "job"
    t = time.time_ns() - 10**10
    for n in range(RANKS // PER_NODE):
        ranks = range(n * PER_NODE, (n + 1) * PER_NODE)
        failures = []
        for rank in ranks:
            tb = FIRST_TB if rank == FIRST else PEER_TB
            at = t + order().index(rank) * 10**6
            error_file(job / "torchrun" / f"7_{n}" / "attempt_0" / str(rank % PER_NODE) / "error.json", tb, at)
            failures.append(
                summary.RankFailure(
                    rank=rank,
                    local_rank=rank % PER_NODE,
                    host=node(rank),
                    pid=rank,
                    exitcode=1,
                    timestamp=at / 1e9,
                    traceback=tb,
                    log_tail="",
                )
            )
        failures.sort(key=lambda f: (f.secondary, f.timestamp, f.rank))
        lines = "".join(f"[rank{r}]: {line}\n" for r in ranks for line in LOG.splitlines()[:3000])
        (job / f"node-{n}.out").write_text(lines + summary.render(failures) + "\n")  # ~0.5 MB a node
    before = rchar()
    failure = find_failure(job, "torchrun")
    read = rchar() - before
    assert (failure.rank, failure.host) == (FIRST, "n6") and "RuntimeError: boom on 43" in failure.traceback
    # each node's first failure, then the ranks each node's summary names after it: every other rank, in two lines
    assert failure.others == (
        "ranks 0,8,16,24,32,48,56 on 7 nodes: exit code 1",
        "ranks 1-7,9-15,17-23,25-31,33-39,49-55,57-63 on 7 nodes: stopped after another rank "
        "failed (connection closed by peer)",
        "ranks 40-42,44-47 on n6: stopped after rank 43 failed (connection closed by peer)",
    ), failure.others
    assert read < 8 * 300 * 1024, read  # the end of each node's log, not all of it


def test_one_ranks_log_in_torchrun_mode_comes_from_its_own_nodes_log(tmp_path):
    run = tmp_path / "run"
    (run / "metrics").mkdir(parents=True)
    (run / "7").mkdir()
    (run / "7.out").write_text("trainscale: job 7 on n[1-8], master n4:29500, restart 0, logs in ...\n")
    where = {r: (r // PER_NODE + 3) % 8 for r in range(RANKS)}  # torchrun numbers the nodes as they arrive
    for rank, k in where.items():
        (run / "metrics" / f"rank-{rank}.jsonl").write_text(json.dumps({"kind": "meta", "node": f"n{k + 1}"}) + "\n")
    for k in range(8):
        ranks = [r for r in range(RANKS) if where[r] == k]
        (run / "7" / f"node-{k}.out").write_text(
            "".join(f"[rank{r}]: {line}\n" for r in ranks for line in LOG.splitlines()[:5000])
        )
    record = JobRecord(
        job_id="7",
        name="sim",
        launcher="torchrun",
        profile="p",
        script="",
        output_dir="",
        world_size=RANKS,
        ranks_per_node=PER_NODE,
        run_dir=str(run),
    )
    one_log = (run / "7" / "node-0.out").stat().st_size
    before = rchar()
    text = rank_log_text(record, FIRST)
    read = rchar() - before
    assert text.splitlines() == LOG.splitlines()[:5000]
    assert read < 1.5 * one_log, (read, one_log)  # its node's log, not all eight
