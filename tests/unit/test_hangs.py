"""The verdict on a hang (runtime/hangwatch/verdict.py), from heartbeat records as the watcher holds them: who waits,
who
is missing, who called another collective, who stopped responding; and no verdict before the notice interval."""

from __future__ import annotations

from trainscale.runtime.hangwatch.verdict import STALE_S, UNREACHABLE, State, count_desync, diagnose, ledger_desync


def _entry(
    seq: int,
    op: str = "all_reduce",
    sizes=((354,),),
    *,
    age: float = 25.0,
    done: bool = False,
    site: str = "train.py:40 in main",
) -> dict:
    return {
        "pg": "pg:0",
        "seq": seq,
        "op": op,
        "sizes": [list(s) for s in sizes],
        "site": site,
        "age_s": age,
        "done": done,
    }


def _state(rank: int, issued: int, ledger: list | None = None, **fields) -> State:
    return State(
        rank=rank,
        step=fields.pop("step", 5),
        issued={"pg:0": issued},
        host=f"node{rank // 2}",
        pid=100 + rank,
        site=fields.pop("site", "train.py:30 in main"),
        ledger=ledger,
        **fields,
    )


def test_nothing_is_said_before_a_rank_has_waited_the_notice_interval():
    states = {0: _state(0, 11, [_entry(11, age=12.0)]), 1: _state(1, 10)}
    assert diagnose(states, notice_s=20.0) is None
    assert diagnose(states, notice_s=10.0).culprits == [1]


def test_ranks_that_never_issued_the_collective_are_missing_with_where_they_are_and_their_stacks():
    waiting = [_entry(10, done=True), _entry(11)]
    states = {
        0: _state(0, 11, waiting),
        1: _state(1, 10, site="data.py:13 in __getitem__", stacks="Thread MainThread (main):\n  sleep"),
        2: _state(2, 11, waiting),
        3: _state(3, 11, waiting),
    }
    verdict = diagnose(states, notice_s=20.0)
    assert (verdict.kind, verdict.waiting, verdict.culprits) == ("missing", [0, 2, 3], [1])
    text = verdict.text()
    assert text.startswith(
        "rank(s) 0, 2, 3 waited 25s in all_reduce of shape [354] (collective #11 of process "
        "group 0), issued at train.py:40 in main — rank(s) 1 did not arrive"
    ), text
    assert "rank 1 on node0 (pid 101): step 5, at data.py:13 in __getitem__, 1 collective(s) behind" in text
    assert "rank 1's Python stack (every thread, innermost last):\nThread MainThread (main):\n  sleep" in text
    assert verdict.event()["culprits"] == [1] and verdict.event()["verdict"] == "missing"


def test_a_rank_zero_download_behind_a_barrier_gets_the_notice_naming_rank_zero():
    """The seeds' own pattern: rank 0 downloads while the others wait in a barrier. A notice, not a kill."""
    barrier = [_entry(3, "barrier", sizes=((1,),), age=120.0)]
    states = {0: _state(0, 2, site="data.py:20 in download"), 1: _state(1, 3, barrier), 2: _state(2, 3, barrier)}
    verdict = diagnose(states, notice_s=20.0)
    assert verdict.culprits == [0] and "waited 120s in barrier" in verdict.text()


def test_ranks_that_called_different_collectives_are_a_desync_with_both_sites():
    """Shapes 3 and 4 at one collective: gloo let rank 0 finish its side and move on; rank 1 still waits."""
    states = {
        0: _state(0, 17, [_entry(16, sizes=((3,),), done=True), _entry(17, "all_reduce in backward")]),
        1: _state(1, 16, [_entry(15, done=True), _entry(16, sizes=((4,),), site="train.py:41 in main")]),
    }
    verdict = diagnose(states, notice_s=20.0)
    assert verdict.kind == "desync" and verdict.culprits == [0, 1], verdict.text()
    text = verdict.text()
    assert "rank(s) 0: all_reduce of shape [3] (collective #16 of process group 0), issued at train.py:40" in text
    assert "rank(s) 1: all_reduce of shape [4] (collective #16 of process group 0), issued at train.py:41" in text


def test_of_many_ranks_the_few_in_another_collective_are_named():
    skipped = [_entry(9, "all_reduce in backward (DDP's gradient all-reduce)")]
    states = {r: _state(r, 9, [_entry(9, "broadcast", sizes=((4,),))]) for r in range(4)}
    states[2] = _state(2, 9, skipped)
    verdict = diagnose(states, notice_s=20.0)
    assert verdict.kind == "desync" and verdict.culprits == [2]


def test_a_silent_rank_is_named_with_how_its_process_is():
    waiting = [_entry(11)]
    stopped = _state(1, 4, step=2, silent_s=STALE_S + 10)
    stopped.process = "stopped (SIGSTOP or a debugger)"
    verdict = diagnose({0: _state(0, 11, waiting), 1: stopped}, notice_s=20.0)
    text = verdict.text()
    assert verdict.culprits == [1] and "rank(s) 1 did not arrive" in text
    assert (
        "rank 1 on node0 (pid 101): not responding for 16s (its process is stopped (SIGSTOP or a debugger)); "
        "last heard of at step 2" in text
    )
    assert "rank 1 sent no stack: its process is stopped" in text
    held = _state(1, 11, [_entry(11, age=2.0)], silent_s=STALE_S + 1, stacks="(written by its C watchdog ...)\nre.py")
    held.process = "running"
    verdict = diagnose({0: _state(0, 11, waiting), 1: held}, notice_s=20.0)
    assert verdict.kind == "unresponsive" and "its Python holds the GIL in C code" in verdict.text()
    assert "re.py" in verdict.text()


def test_every_rank_inside_the_collective_and_none_missing_is_a_stuck_collective():
    waiting = [_entry(11)]
    verdict = diagnose({0: _state(0, 11, waiting), 1: _state(1, 11, waiting)}, notice_s=20.0)
    assert verdict.kind == "stuck" and verdict.culprits == []
    assert "every rank is inside it and none is missing" in verdict.text()


def test_a_rank_without_a_record_is_missing_and_unreachable_records_blame_the_store_host():
    waiting = [_entry(11)]
    verdict = diagnose({0: _state(0, 11, waiting), 1: None}, notice_s=20.0)
    assert verdict.culprits == [1] and "rank 1: no heartbeat" in verdict.text()
    verdict = diagnose({0: UNREACHABLE, 1: _state(1, 11, waiting), 2: UNREACHABLE}, notice_s=20.0)
    assert verdict.kind == "unresponsive" and verdict.culprits == [0]


def test_counts_that_differ_at_the_end_of_the_same_step_name_the_odd_rank_and_the_step():
    states = {r: _state(r, 40, counts=[[3, 9], [4, 12 if r != 2 else 11], [5, 15 if r != 2 else 14]]) for r in range(4)}
    states[3].counts = states[3].counts[:1]  # a rank a step behind shares step 3 only: no evidence from it
    verdict = count_desync(states)
    assert (verdict.kind, verdict.culprits) == ("desync", [2]), verdict.text()
    assert "by the end of step 4" in verdict.text() and "rank(s) 2 issued a different collective" in verdict.text()
    assert (
        "rank 2 on node1 (pid 102): step 5, at train.py:30 in main: 11 collective(s) by the end of step 4 "
        "(-1 against rank 0)" in verdict.text()
    )
    two = {r: _state(r, 40, counts=[[4, 12 + r]]) for r in range(2)}
    assert count_desync(two).culprits == [1]  # no majority of two: compared with rank 0's
    assert count_desync({r: _state(r, 40, counts=[[4, 12]]) for r in range(2)}) is None


def test_a_collective_in_flight_that_another_rank_issued_with_another_shape_is_a_desync_with_its_site():
    rank0 = _state(0, 10, [_entry(9, done=True), _entry(10, sizes=((1, 4),))])
    rank1 = _state(
        1, 11, [_entry(10, sizes=((2,),), done=True, site=None), _entry(11, sizes=((2,),))], site="train.py:16 in main"
    )
    verdict = ledger_desync({0: rank0, 1: rank1})
    assert (verdict.kind, verdict.culprits) == ("desync", [1])
    assert (
        "rank 1 on node0 (pid 101): all_reduce of shape [2] (collective #10 of process group 0), now at "
        "train.py:16 in main" in verdict.text()
    )
    # done everywhere (a destroyed group's entries under the same name), or not issued in this group: no evidence
    assert (
        ledger_desync(
            {0: _state(0, 10, [_entry(10, done=True)]), 1: _state(1, 10, [_entry(10, sizes=((2,),), done=True)])}
        )
        is None
    )
    assert ledger_desync({0: rank0, 1: _state(1, 9, [_entry(10, sizes=((2,),), done=True)])}) is None
