"""The straggler watch at many ranks: rank 0's look costs two store requests whatever the world size, and
opens no file (64 simulated ranks publishing to a real TCPStore); a watch without a store reads only the
ends of the record files, however long the run (benchmarks/rank_costs.py measures both up to 1,024 ranks)."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

import pytest
from helpers.counting_store import Counting

from trainscale.observe.records import RankRecorder
from trainscale.observe.stragglers import RankTail, StragglerWatch
from trainscale.observe.window import Publisher, RankWindow
from trainscale.runtime.store import bound_server, client

RANKS = 64
SLOW = 37


def _steps(rank: int, n: int) -> list[dict]:
    slow = 0.02 if rank == SLOW else 0.0  # its data wait, which the others wait for at the all-reduce
    return [
        {"kind": "step", "step": s, "step_s": 0.1, "data_s": 0.001 + slow, "compute_s": 0.05, "comm_s": 0.049 - slow}
        for s in range(n)
    ]


def test_the_watch_reads_64_ranks_from_the_store_in_two_requests_and_no_file(tmp_path):
    server = bound_server("127.0.0.1", 0, datetime.timedelta(seconds=30))
    ranks = client("127.0.0.1", server.port, datetime.timedelta(seconds=30))
    publishers = []
    for rank in range(RANKS):
        window = RankWindow(20, {"node": f"nid{rank // 8 + 1:05d}", "cpus": [rank % 8]})
        publishers.append(Publisher(ranks, rank, window))
    said: list[str] = []
    store = Counting(client("127.0.0.1", server.port, datetime.timedelta(seconds=30)))
    watch = StragglerWatch(tmp_path, say=said.append, store=store, world_size=RANKS)

    for rank, publisher in enumerate(publishers[:-1]):  # the last rank has not published yet
        for record in _steps(rank, 45):
            publisher.window.add(record)
        publisher.maybe(force=True)
    assert watch.check() is None and store.calls == ["check"]  # nothing waits for the missing rank

    for record in _steps(RANKS - 1, 45):
        publishers[-1].window.add(record)
    publishers[-1].maybe(force=True)
    assert ranks.check([f"trainscale/window/{RANKS - 1}"])  # sets are not answered: this returns once they are applied
    store.calls.clear()
    found = watch.check()
    assert store.calls == ["check", "multi_get"], store.calls  # one look, two requests, at 64 ranks as at 2
    assert found is not None and (found.rank, found.host) == (SLOW, "nid00005"), found
    assert found.phase == "data" and said == [f"trainscale: straggler: {found.describe()}"]
    # no rank file was there to read; the late rank's flag (observe/place.py) is all the watch wrote beside its event
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["events.jsonl", f"late-rank-{SLOW}", "metrics"]


def test_a_recorder_in_a_group_publishes_its_window_at_most_every_half_second(tmp_path):
    store = Counting(bound_server("127.0.0.1", 0, datetime.timedelta(seconds=30)))
    rec = RankRecorder(tmp_path, 3, store=store, window=5, node="n2")
    for step, record in enumerate(_steps(3, 1000)):
        rec.step(
            step, record["step_s"], data_s=record["data_s"], compute_s=record["compute_s"], comm_s=record["comm_s"]
        )
    assert store.calls.count("set") <= 2  # a tight loop of 1,000 steps: once at its start, maybe once more
    rec.close()
    published = json.loads(store.store.get("trainscale/window/3"))
    assert published["w"] == 5 and published["n"] == 10 and published["node"] == "n2"
    assert published["now"] == published["before"] == pytest.approx(0.051)  # the last steps', on close


def _rchar() -> int:
    return int(
        next(line for line in Path("/proc/self/io").read_text().splitlines() if line.startswith("rchar:")).split()[1]
    )


def test_a_watch_starting_on_a_long_runs_files_reads_only_their_ends(tmp_path):
    path = tmp_path / "rank-0.jsonl"
    meta = json.dumps({"kind": "meta", "rank": 0, "node": "n1"})
    lines = [json.dumps(r) for r in _steps(0, 20000)]  # about 1.7 MB: a long run's file
    path.write_text(meta + "\n" + "\n".join(lines) + "\n")
    tail = RankTail(path, keep=40)
    before = _rchar()
    first = tail.read()
    assert _rchar() - before < 200_000  # not the whole file: the meta line and the last 40 lines' worth
    assert first[0]["kind"] == "meta" and [r["step"] for r in first[1:]] == list(range(19960, 20000))
    with open(path, "a") as fh:  # the run went on while the watch was not looking
        fh.write("\n".join(json.dumps({**r, "step": 20000 + r["step"]}) for r in _steps(0, 5000)) + "\n")
    before = _rchar()
    again = tail.read()
    assert _rchar() - before < 200_000
    assert [r["step"] for r in again[1:]] == list(range(24960, 25000)) and again[0] == first[0]
    assert tail.offset == path.stat().st_size
