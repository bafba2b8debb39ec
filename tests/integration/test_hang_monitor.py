"""The watching heartbeat that names a hung rank on NCCL, where the waiting rank's main thread is stuck
in a CUDA synchronisation that no Python exception reaches.

Here on gloo ranks the main thread's wait is a plain Event standing in for ``torch.cuda.synchronize``
(the one narrow fake); the store, the ranks, the progress records and the detection are real.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from datetime import timedelta

from helpers.multiproc import run_on_ranks

TIMEOUT_S = 2.0
WAIT = timedelta(seconds=10 * TIMEOUT_S + 30)  # bounds on the test's own waits, so a failing test ends


def stalled_rank_zero() -> dict:
    import torch
    import torch.distributed as dist

    import trainscale
    from trainscale.runtime.hangwatch.heartbeat import Heartbeat

    with trainscale.init(timeout_s=TIMEOUT_S, set_threads=False) as rt:
        store = dist.distributed_c10d._get_default_store()
        found: dict = {}
        unstuck = threading.Event()

        def on_hang(error) -> None:  # instead of ending the process: record and release the main thread
            found["message"] = str(error)
            unstuck.set()

        rt._progress = Heartbeat(rt, watch=True, on_hang=on_hang)
        with rt.guard(0):
            t = torch.ones(1)
            dist.all_reduce(t)  # step 0 completes on both ranks
        if rt.rank == 0:
            with rt.guard(1):
                # NCCL would have queued the all-reduce and returned; the main thread then blocks in a
                # device synchronisation until the peer arrives. Bounded, so a failing test ends.
                unstuck.wait(WAIT.total_seconds())
            store.set("test/released", "1")
        else:
            store.wait(["test/released"], WAIT)  # rank 1 "hangs": it never enters step 1
        return found


def test_a_rank_stuck_where_no_exception_reaches_names_the_missing_rank():
    results = run_on_ranks(stalled_rank_zero, 2, timeout=120)
    message = results[0].get("message", "")
    assert "rank 0: training step (gradient all-reduce) at step 1 did not complete within 2s" in message
    assert "rank(s) 1 did not arrive" in message and "): step 0, at " in message
    assert results[1] == {}  # the hung rank itself is behind nobody: it does not fire


def stalled_inside_the_step() -> dict:
    """NCCL-like, in the README's pattern: both ranks enter step 1; rank 0 queues its all-reduce (async, as
    NCCL returns at once) and waits where a CUDA synchronisation would; rank 1 hangs before its own."""
    import torch
    import torch.distributed as dist

    import trainscale
    from trainscale.runtime.hangwatch.heartbeat import Heartbeat

    with trainscale.init(timeout_s=TIMEOUT_S, set_threads=False) as rt:
        store = dist.distributed_c10d._get_default_store()
        found: dict = {}
        unstuck = threading.Event()

        def on_hang(error) -> None:
            found["message"] = str(error)
            unstuck.set()

        rt._progress = Heartbeat(rt, watch=True, on_hang=on_hang)
        with rt.guard(0):
            dist.all_reduce(torch.ones(1))
        with rt.guard(1):
            if rt.rank == 0:
                work = dist.all_reduce(torch.ones(1), async_op=True)
                unstuck.wait(WAIT.total_seconds())
                store.set("test/released", "1")
            else:
                hung_in_forward(store)
        if rt.rank == 0:
            try:
                work.wait()  # gloo gives up on it at its own timeout; rank 1 never joined
            except RuntimeError:
                pass
        rt.close(synchronize=False)  # the group is broken: no closing barrier
        return found


def hung_in_forward(store) -> None:
    store.wait(["test/released"], WAIT)


def test_a_rank_hung_inside_the_step_is_named_with_its_stack_by_the_watching_heartbeat():
    results = run_on_ranks(stalled_inside_the_step, 2, timeout=120)
    message = results[0].get("message", "")
    assert "rank 0: training step (gradient all-reduce) at step 1 did not complete within 2s" in message, message
    assert "rank(s) 1 did not arrive" in message and "): step 1, at " in message and "1 collective(s) behind" in message
    assert "rank 1's Python stack" in message and "in hung_in_forward" in message, message
    assert results[1] == {}


def late_group(delay_s: float) -> str:
    """After the heartbeat has read every record, a group whose ranks arrive ``delay_s`` apart: rank 0
    reads the group's id from the store as NCCL's communicator creation does (a blocking get that waits
    with the store's timeout), rank 1 comes late and publishes it, then both make the gloo group."""
    import torch
    import torch.distributed as dist

    import trainscale

    with trainscale.init(timeout_s=60, set_threads=False) as rt:
        with rt.guard(0):
            dist.all_reduce(torch.ones(1))
        assert len(rt._progress.watcher._read_records()) == 2  # the watcher's read
        store = dist.PrefixStore("late-group/", dist.distributed_c10d._get_default_store())
        dist.barrier()
        if rt.rank == 1:
            threading.Event().wait(delay_s)  # the deliberate lateness
            store.set("id", "42")
        group_id = store.get("id").decode()
        group = dist.new_group(backend="gloo")
        t = torch.ones(1)
        dist.all_reduce(t, group=group)
        dist.destroy_process_group(group)
        return f"group {group_id}, sum {t.item():g}"


def test_a_group_made_after_the_watcher_read_waits_as_long_as_the_job_allows():
    """The watcher's reads once cut the default store's timeout to 5 s for good: every later NCCL
    communicator, DeviceMesh or background-save group on NCCL then failed for ranks 7 s apart."""
    assert run_on_ranks(late_group, 2, 7.0, timeout=120) == {0: "group 42, sum 2", 1: "group 42, sum 2"}


def everyone_in_a_long_step() -> dict:
    """Both ranks sit in the same step (a long checkpoint or evaluation) past the timeout: no hang."""
    import torch.distributed as dist

    import trainscale
    from trainscale.runtime.hangwatch.heartbeat import Heartbeat

    with trainscale.init(timeout_s=TIMEOUT_S, set_threads=False) as rt:
        store = dist.distributed_c10d._get_default_store()
        found: dict = {}
        tracker = rt._progress = Heartbeat(rt, watch=True, on_hang=lambda error: found.update(m=str(error)))
        looks = threading.Event()
        original = tracker.watcher._read_records

        def read_all():
            records = original()
            looks.set()  # the heartbeat has looked at everybody at least once, after the timeout
            return records

        tracker.watcher._read_records = read_all
        with rt.guard(0):
            if rt.rank == 0:
                looks.wait(WAIT.total_seconds())
                store.set("test/looked", "1")
            else:
                store.wait(["test/looked"], WAIT)
        return found


def test_every_rank_in_the_same_long_step_is_not_a_hang():
    results = run_on_ranks(everyone_in_a_long_step, 2, timeout=120)
    assert results == {0: {}, 1: {}}


def test_ending_the_process_reports_like_an_uncaught_error(tmp_path):
    """The default action: callbacks, stderr, the launcher's error file (torchelastic's format), exit 124."""
    error_file, callback_file = tmp_path / "error.json", tmp_path / "callback.txt"
    script = textwrap.dedent(f"""
        import datetime
        from types import SimpleNamespace
        from trainscale.runtime.hangwatch.watch import CollectiveTimeout, end_process

        error = CollectiveTimeout("rank 0: step 3 did not complete within 5s — rank(s) 1 did not arrive",
                                  hint="look at the named rank's log")
        runtime = SimpleNamespace(rank=0, timeout_callbacks=[
            lambda e: open({str(callback_file)!r}, "w").write(str(e).splitlines()[0])])
        end_process(runtime, error)
        print("not reached")
    """)
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(error_file)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 124 and "not reached" not in done.stdout
    assert "CollectiveTimeout: rank 0: step 3 did not complete within 5s — rank(s) 1 did not arrive" in done.stderr
    recorded = json.loads(error_file.read_text())["message"]
    assert "rank(s) 1 did not arrive" in recorded["message"]
    assert "CollectiveTimeout" in recorded["extraInfo"]["py_callstack"]
    assert callback_file.read_text() == "rank 0: step 3 did not complete within 5s — rank(s) 1 did not arrive"


def test_a_flight_recorder_dump_that_never_returns_neither_hides_the_error_nor_keeps_the_process(tmp_path):
    """issue 39 defect 8: the dump (a wedged GPU can hold it forever) ran before the error file was written:
    the launcher's summary lost the named hang. The error file comes first; the dump gets a bounded wait."""
    error_file = tmp_path / "error.json"
    script = textwrap.dedent("""
        import threading
        from types import SimpleNamespace
        from trainscale.runtime.hangwatch import watch as hangwatch

        hangwatch._dump_flight_recorder = lambda *args: threading.Event().wait()  # wedged
        hangwatch.DUMP_WAIT_S = 0.5
        hangwatch.end_process(SimpleNamespace(rank=0, timeout_callbacks=[]),
                              hangwatch.CollectiveTimeout("rank 0: step 3 did not complete within 5s — rank(s) 1 "
                                                          "did not arrive"))
    """)
    env = {**os.environ, "TORCHELASTIC_ERROR_FILE": str(error_file)}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 124, done.stderr
    assert "rank(s) 1 did not arrive" in json.loads(error_file.read_text())["message"]["message"]


def a_background_save_during_a_stall() -> dict:
    """Rank 0 (the culprit) never joins all-reduce #2 of the training's group, which rank 1 waits in; rank 0's
    checkpoint writer meanwhile has issued the background save's collective on trainscale's own checkpoint group,
    which rank 1's writer has not started (each rank's writer runs at its own pace)."""
    import torch
    import torch.distributed as dist

    import trainscale
    from trainscale.checkpoint.background import checkpoint_group
    from trainscale.runtime.hangwatch.heartbeat import Heartbeat

    with trainscale.init(timeout_s=60, set_threads=False) as rt:
        store = dist.distributed_c10d._get_default_store()
        group = checkpoint_group(rt)
        dist.all_reduce(torch.ones(1))  # collective #1 of the training's group, on both ranks
        beat = Heartbeat(rt, notice_s=0)
        found: dict = {}
        if rt.rank == 0:
            save = dist.all_reduce(torch.ones(4), group=group, async_op=True)  # the writer's, in flight
            beat._publish(beat._changed_at)  # its progress as it stands, then 10 s later: stalled, its ledger
            found["record"] = beat._publish(beat._changed_at + 10)
            store.set("test/published", "1")
            store.wait(["test/judged"], WAIT)
            dist.all_reduce(torch.ones(1))  # rank 0 arrives at last
        else:
            step = dist.all_reduce(torch.ones(1), async_op=True)  # collective #2: rank 0 never comes
            store.wait(["test/published"], WAIT)
            verdict = beat.watcher.diagnose_now()
            found.update(kind=verdict.kind, culprits=verdict.culprits, collective=verdict.collective)
            store.set("test/judged", "1")
            save = dist.all_reduce(torch.ones(4), group=group, async_op=True)  # rank 1's writer, later
            step.wait()
        save.wait()
        beat.close()
        return found


def test_a_background_save_during_a_stall_does_not_change_the_verdict():
    """issue 47 N5: the checkpoint group's collectives counted in the hang arithmetic, so rank 1, whose writer
    had not yet started the save's collective, was named behind (or the save's collective was taken for the
    one everybody waits in) while rank 0 held up the training's all-reduce."""
    results = run_on_ranks(a_background_save_during_a_stall, 2, timeout=120)
    assert results[1] == {
        "kind": "missing",
        "culprits": [0],
        "collective": "all_reduce of shape [1] (collective #2 of process group 0)",
    }, results[1]
    record = results[0]["record"]
    assert record["issued"] == {"pg:0": 1} and record["background_groups"] == {"pg:1": "trainscale-checkpoint"}
    assert all(entry["pg"] == "pg:0" for entry in record["ledger"]), record["ledger"]
