"""The launcher's failure summary names the hung rank as the root cause: the ranks that failed first are
the healthy ones that timed out waiting for it, and the hung one is only ended by the launcher after."""

from __future__ import annotations

import signal

from trainscale.launch.summary import RankFailure, from_child_failed, render

TIMED_OUT = (
    "Traceback (most recent call last):\n  ...\ntrainscale.runtime.hangwatch.watch.CollectiveTimeout: rank 1: "
    "training step (gradient all-reduce) at step 3 did not complete within 5s — rank(s) 3 did not arrive "
    "(last seen: rank 3: step 3, 1 collective(s) behind; rank 0: step 3)\nrank 3's Python stack (main "
    'thread, innermost last):\n  File "train.py", line 21, in <module>\n    stall()'
)
RELAYED = (
    "RuntimeError: [gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:27530\n\nThe above "
    "exception was the direct cause of the following exception:\n\nCollectiveTimeout: rank 0: training step at "
    "step 3 failed: a peer timed out and closed its connections; its diagnosis: " + TIMED_OUT.split(": ", 1)[1]
)


def _failure(rank: int, exitcode: int, traceback: str, at: float) -> RankFailure:
    return RankFailure(
        rank=rank,
        local_rank=rank,
        host="node1",
        pid=100 + rank,
        exitcode=exitcode,
        timestamp=at,
        traceback=traceback,
        log_tail="",
    )


class _Failed:
    def __init__(self, rank, exitcode, message, at):
        self.local_rank, self.pid, self.exitcode, self.timestamp = rank, 100 + rank, exitcode, at
        self.error_file, self.error_file_data = (
            "",
            {"message": {"message": message, "extraInfo": {"py_callstack": message}}} if message else {},
        )


def test_the_hung_rank_is_the_root_cause_and_marked_among_the_others():
    error = type(
        "ChildFailedError",
        (),
        {
            "failures": {
                0: _Failed(0, 1, RELAYED, 10.0),  # failed first, but of a peer's closed connection: secondary
                1: _Failed(1, 1, TIMED_OUT, 10.4),
                2: _Failed(2, -signal.SIGTERM, "", 10.6),
                3: _Failed(3, -signal.SIGTERM, "", 10.6),
            }
        },
    )()
    text = render(from_child_failed(error), world_size=4)
    assert "first failing rank: 1 on" in text
    assert (
        "Root cause: rank(s) 3 hung (stopped participating); rank 1 timed out waiting and names it below, "
        "with its Python stack where it could get it"
    ) in text
    others = {line.split()[1]: line for line in text.splitlines() if line.startswith("  rank ")}
    assert others["3"].endswith(": killed by SIGTERM — the hung rank")
    assert others["2"].endswith(": stopped after rank 1 failed (killed by SIGTERM)")
    assert others["0"].endswith(": stopped after rank 1 failed (connection closed by peer)"), others["0"]


def test_a_relayed_diagnosis_names_the_hung_rank_when_no_rank_that_timed_out_got_to_report():
    text = render([_failure(0, 1, RELAYED, 10.0), _failure(3, -signal.SIGTERM, "", 10.2)], world_size=4)
    assert "first failing rank: 0" in text and "Root cause: rank(s) 3 hung" in text


def test_other_failures_name_no_hung_rank():
    text = render([_failure(1, 1, "RuntimeError: CUDA out of memory", 10.0)], world_size=2)
    assert "Root cause" not in text and "hung" not in text


def test_a_rank_gloo_aborted_for_a_collective_mismatch_is_said_to_be_that():
    """A rank that skipped or added an all-reduce of another size: no hang, gloo aborts the rank that receives the
    odd message. The summary says what that means before the faulthandler noise."""
    abort = RankFailure(
        rank=0,
        local_rank=0,
        host="node1",
        pid=100,
        exitcode=-signal.SIGABRT,
        timestamp=10.0,
        traceback="",
        log_tail="terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
        "  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 356 vs 4. Received "
        "data size doesn't match expected size. Is there a distributed collective mismatch in your code?",
    )
    text = render([abort], world_size=2)
    assert (
        "Root cause: the ranks called different collectives (gloo received a message of another size than rank 0's"
        in text
        and "Is there a distributed collective mismatch" in text
    )
