"""The ledger on NCCL (runtime/hangwatch/ledger.py): ProcessGroupNCCL keeps its own flight recorder, which only
``torch._C._distributed_c10d._dump_nccl_trace`` dumps; the gloo/CPU recorder's dump (``_dump_fr_trace``) is empty
there. The dumps here have the shape torch's C++ FlightRecorder::dump serialises (FlightRecorderDetail.hpp,
getCollectiveTrace; the keys torch/distributed/flight_recorder/components/types.py reads), pickled as torch does:
plain dicts, lists, tuples and strings. No GPU is needed: tests/gpu/test_gpu_faults_and_timing.py has the real one.
"""

from __future__ import annotations

import pickle
import time

import pytest
import torch

from trainscale.runtime.hangwatch import ledger
from trainscale.runtime.hangwatch.verdict import State, diagnose

GLOO_EMPTY = {"version": "2.10", "pg_config": {}, "pg_status": {}, "comm_lib_version": "", "entries": []}


def nccl_entry(
    seq: int, *, state: str, age_s: float, sizes=((354,),), op: str = "all_reduce", pg=("0", "default_pg")
) -> dict:
    """One entry as FlightRecorder<CUDAEvent>::getCollectiveTrace writes it (includeStackTraces=False)."""
    created = time.time_ns() - int(age_s * 1e9)
    started = created + 1000 if state in ("started", "completed") else None
    return {
        "record_id": seq - 1,
        "pg_id": 0,
        "process_group": pg,
        "thread_name": "pt_main_thread",
        "thread_id": "140371029415744",
        "collective_seq_id": seq,
        "p2p_seq_id": 0,
        "op_id": seq,
        "profiling_name": f"nccl:{op}",
        "time_created_ns": created,
        "input_sizes": [list(s) for s in sizes],
        "input_dtypes": ["Float"],
        "output_sizes": [list(s) for s in sizes],
        "output_dtypes": ["Float"],
        "state": state,
        "time_discovered_started_ns": started,
        "time_discovered_completed_ns": started + 1000 if state == "completed" else None,
        "retired": state == "completed",
        "timeout_ms": 600000,
        "is_p2p": False,
    }


def nccl_dump(*entries: dict) -> bytes:
    """FlightRecorder::dump's whole pickle: version, pg_config, pg_status, the entries (NCCL's comm state
    is absent where the dump is asked for without it)."""
    return pickle.dumps(
        {
            "version": "2.10",
            "comm_lib_version": "2.27.5",
            "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
            "pg_status": {
                "0": {"last_enqueued_collective": "7", "last_started_collective": "7", "last_completed_collective": "6"}
            },
            "entries": list(entries),
        }
    )


@pytest.fixture
def dumps(monkeypatch):
    """Install the two recorders' dumps: gloo's empty (an NCCL job), NCCL's as given; record how it was asked."""
    asked: list[dict] = []
    c10d = torch._C._distributed_c10d

    def install(*entries: dict) -> list[dict]:
        def nccl(includeCollectives=None, includeStackTraces=None, onlyActive=None):  # torch's binding's names
            asked.append(
                {
                    "includeCollectives": includeCollectives,
                    "includeStackTraces": includeStackTraces,
                    "onlyActive": onlyActive,
                }
            )
            return nccl_dump(*entries)

        monkeypatch.setattr(c10d, "_dump_fr_trace", lambda *a, **k: pickle.dumps(GLOO_EMPTY))
        monkeypatch.setattr(c10d, "_dump_nccl_trace", nccl, raising=False)  # a CPU build has none
        return asked

    return install


def synchronising() -> object:
    """A frame waiting where an NCCL rank waits for its collective: in a CUDA synchronisation (``loss.item()``)."""
    import sys

    def item():
        return sys._getframe()

    return item()


def test_an_nccl_rank_waiting_in_a_cuda_synchronisation_has_its_collective_in_flight(dumps):
    asked = dumps(nccl_entry(7, state="started", age_s=21.0))
    found = ledger.recent(frame=synchronising())
    assert asked == [{"includeCollectives": True, "includeStackTraces": False, "onlyActive": True}]
    assert len(found) == 1
    entry = found[0]
    assert (entry["pg"], entry["seq"], entry["op"], entry["sizes"], entry["done"]) == (
        "pg:0",
        7,
        "all_reduce",
        [[354]],
        False,
    )
    assert 20.5 <= entry["age_s"] <= 30 and "in item" in entry["site"]
    state = State(rank=0, issued={"pg:0": 7}, ledger=found)
    assert state.wait == found and state.waited() >= 20  # recognised as waiting


def test_an_empty_nccl_dump_is_no_record_so_the_main_thread_says_where_it_waits(dumps):
    """issue 47 N1: the gloo recorder's empty dump on an NCCL job was taken for "nothing in flight": no notice."""
    dumps()
    assert ledger.recent(frame=synchronising()) is None


def test_an_nccl_collective_the_watchdog_retired_uncompleted_is_still_in_flight(dumps):
    """NCCL's ``retired`` without ``completed``: its watchdog let it go (timed out); gloo's ``retired``: done."""
    dumps(nccl_entry(7, state="scheduled", age_s=30.0) | {"retired": True})
    assert [e["done"] for e in ledger.recent()] == [False]


def test_the_notice_on_nccl_names_the_missing_rank_with_host_and_frame(dumps):
    dumps(nccl_entry(6, state="started", age_s=21.5), nccl_entry(7, state="scheduled", age_s=21.0))
    waiting = ledger.recent(frame=synchronising())
    states = {
        0: State(
            rank=0,
            step=3,
            issued={"pg:0": 7},
            host="gpu-node-0",
            pid=11,
            site="train.py:41 in main",
            ledger=waiting,
            since=21.0,
        ),
        1: State(
            rank=1,
            step=3,
            issued={"pg:0": 5},
            host="gpu-node-1",
            pid=12,
            site="data.py:13 in load",
            stacks='Thread MainThread (main):\n  File "data.py", line 13, in load',
            since=21.0,
        ),
    }
    verdict = diagnose(states, notice_s=20.0)
    assert (verdict.kind, verdict.waiting, verdict.culprits) == ("missing", [0], [1])
    text = verdict.text()
    assert "all_reduce of shape [354] (collective #6 of process group 0)" in text
    assert "rank 1 on gpu-node-1 (pid 12): step 3, at data.py:13 in load" in text


def test_a_desync_is_named_on_nccl(dumps):
    dumps(nccl_entry(7, state="started", age_s=22.0))
    first = ledger.recent(frame=synchronising())
    dumps(nccl_entry(7, state="started", age_s=22.0, sizes=((355,),)))
    second = ledger.recent(frame=synchronising())
    states = {
        rank: State(rank=rank, step=3, issued={"pg:0": 7}, host=f"gpu-node-{rank}", ledger=found, since=22.0)
        for rank, found in ((0, first), (1, second))
    }
    verdict = diagnose(states, notice_s=20.0)
    assert verdict.kind == "desync" and "of shape [355]" in verdict.text() and "of shape [354]" in verdict.text()
