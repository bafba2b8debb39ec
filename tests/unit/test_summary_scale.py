"""The launcher's end-of-run summary when 64 ranks failed (the first raised, the other 63 died of it): the
first named with its traceback and log, the others in one line, and of the 64 long logs only the first
rank's end read."""

from __future__ import annotations

import json
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

from trainscale.launch.summary import from_child_failed, render

RANKS, FIRST = 64, 17
LOG = "".join(f"step {i}: loss 0.{i:05d} throughput 1234.5 samples/s\n" for i in range(20000))  # ~0.9 MB a rank


def rchar() -> int:
    return int(
        next(line for line in Path("/proc/self/io").read_text().splitlines() if line.startswith("rchar:")).split()[1]
    )


def test_the_summary_of_64_failed_ranks(tmp_path):
    failures, logs = {}, {}
    for rank in range(RANKS):
        d = tmp_path / str(rank)
        d.mkdir()
        tb = "RuntimeError: boom on 17" if rank == FIRST else "RuntimeError: Connection closed by peer"
        (d / "error.json").write_text(
            json.dumps(
                {
                    "message": {
                        "message": tb,
                        "extraInfo": {
                            "py_callstack": f"Traceback (most recent call last):\n{tb}",
                            "timestamp": str(1000 + (rank != FIRST)),
                        },
                    }
                }
            )
        )
        (d / "stderr.log").write_text(LOG + f"the last line of rank {rank}\n")
        failures[rank] = ProcessFailure(local_rank=rank, pid=100 + rank, exitcode=1, error_file=str(d / "error.json"))
        logs[rank] = d / "stderr.log"
    before = rchar()
    found = from_child_failed(ChildFailedError("train.py", failures), logs)
    read = rchar() - before
    text = render(found, world_size=RANKS, log_dir=tmp_path)
    assert f"first failing rank: {FIRST} on" in text and "RuntimeError: boom on 17" in text, text
    other = text[text.index("Other ranks:") :].splitlines()
    assert other[1].startswith("  ranks 0-16,18-63 on ") and other[1].endswith(
        f": stopped after rank {FIRST} failed (connection closed by peer)"
    ), other
    assert other[2] == "", other  # the heading and one line for 63 ranks
    assert read < 512 * 1024, read  # the error files and the end of one log, not 64 logs of 0.9 MB
