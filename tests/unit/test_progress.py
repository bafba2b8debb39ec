"""The heartbeat (runtime/hangwatch/heartbeat.py): it publishes progress to a real store and is gone once closed; a
collective timeout is explained with the missing rank and the stack its heartbeat sends; a peer relays the
diagnosis; the records of many ranks are read in two requests; the watch's notice comes once."""

from __future__ import annotations

import datetime
import json
from types import SimpleNamespace

from helpers.counting_store import Counting
from torch.distributed import TCPStore

from trainscale.runtime.hangwatch import heartbeat as progress
from trainscale.runtime.hangwatch import ledger, peers
from trainscale.runtime.hangwatch import watch as hangwatch
from trainscale.runtime.hangwatch.heartbeat import Heartbeat
from trainscale.runtime.hangwatch.watch import UNREACHABLE


def _store(timeout_s: float = 5.0) -> TCPStore:
    return TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=datetime.timedelta(seconds=timeout_s))


def _peer(rank: int, world: int, store, **kwargs) -> Heartbeat:
    runtime = SimpleNamespace(is_distributed=False, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=5))
    beat = Heartbeat(runtime, **kwargs)
    beat.store = store
    return beat


def test_the_heartbeat_publishes_the_step_and_is_joined_on_close():
    """A heartbeat left running into interpreter shutdown aborts the process (SIGABRT) after a good run."""
    beat = _peer(0, 1, _store())
    beat.mark(7, "gradient all-reduce")
    assert beat.beating
    record = json.loads(beat.store.get("trainscale/progress/0"))
    assert (record["step"], record["op"], record["issued"], record["beat"]) == (7, "gradient all-reduce", {}, 1)
    assert "test_the_heartbeat_publishes_the_step" in record["site"]  # where the main thread is
    beat.close()
    assert not beat.beating


def test_every_way_gloo_words_a_timeout_is_explained_and_other_errors_are_not():
    """With several DDP buckets, the bucket that surfaces first may be one whose pair an earlier
    bucket's timeout closed: gloo then says "Application timeout caused pair closure" (seen in CI)."""
    beat = _peer(0, 2, _store())
    beat.issued = lambda: {"pg:0": 4}
    beat.mark(3)
    for text in (
        "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out waiting 5000ms for recv operation",
        "Application timeout caused pair closure",
    ):
        explained = beat.watcher.explain(RuntimeError(text))
        assert explained is not None and "rank(s) 1 did not arrive" in str(explained), text
    assert beat.watcher.explain(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 6x2)")) is None
    beat.close()


def test_the_error_names_the_hung_rank_with_the_stack_its_heartbeat_sends():
    """Rank 1's heartbeat record carries its stacks once it stalled (within half the 5 s timeout): this test's main
    thread, which waits for them in diagnose_now. Its record says step 3 with one all-reduce fewer than rank 0."""
    store = _store()
    waiting, hung = _peer(0, 2, store), _peer(1, 2, store)
    waiting.issued, hung.issued = (lambda: {"pg:0": 8}), (lambda: {"pg:0": 7})
    waiting.mark(3, "gradient all-reduce")
    hung.mark(3)
    error = waiting.watcher.explain(RuntimeError("[gloo/transport/tcp/pair.cc:534] Timed out waiting 5000ms for recv"))
    waiting.close(), hung.close()
    text = str(error)
    assert text.startswith("rank 0: gradient all-reduce at step 3 did not complete within 5s: rank(s) 0 waited"), text
    assert "gradient all-reduce (collective #8 of process group 0), issued at " in text
    assert "— rank(s) 1 did not arrive" in text
    assert "rank 1 on " in text and ": step 3, at " in text and "1 collective(s) behind" in text
    assert "rank 1's Python stack (every thread, innermost last):" in text and ", in diagnose_now\n" in text
    assert "in test_the_error_names_the_hung_rank_with_the_stack_its_heartbeat_sends" in text
    assert peers.await_diagnosis(store, 0) == text.split("\nHint:")[0]  # posted for the peers to relay


def test_a_peer_whose_connection_a_timed_out_rank_closed_relays_its_diagnosis(monkeypatch):
    """gloo: the rank that timed out closes its connections; its peers fail at once with "Connection closed
    by peer". They carry the diagnosis it posted; after a peer that crashed (nothing posted) the error stays."""
    monkeypatch.setattr(hangwatch, "STACKS_WAIT_S", 0.2)
    store = _store()
    peer = _peer(2, 4, store)
    peer.mark(3, "gradient all-reduce")
    closed = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:27530")
    assert peer.watcher.explain(closed) is None
    peers.post(store, "rank 0: step 3 did not complete within 5s — rank(s) 3 did not arrive", complete=False)
    relayed = str(peer.watcher.explain(closed))
    assert relayed.startswith(
        "rank 2: gradient all-reduce at step 3 failed: a peer timed out and closed its "
        "connections; its diagnosis: rank 0: step 3 did not complete within 5s — rank(s) 3 "
        "did not arrive"
    )
    peer.close()


def test_the_store_timeout_every_later_group_waits_with_is_left_alone():
    """The heartbeat reads with a short timeout on a connection of its own (issue 22 item 5)."""
    store = _store(timeout_s=1800)
    own, separate = progress._own_connection(store)
    assert separate and own.timeout == hangwatch.READ_TIMEOUT and store.timeout == datetime.timedelta(minutes=30)
    shared = _peer(0, 2, store)  # the fallback on a torch without Store.clone: set for the reads, then put back
    shared.mark(1)
    shared.watcher._read_records()
    assert store.timeout == datetime.timedelta(minutes=30)
    shared.close()


def test_ranks_in_step_with_the_same_collectives_issued_name_nobody():
    """Every rank issued as many collectives, yet one timed out: the message says nobody is behind instead of
    naming a healthy rank."""
    store = _store()
    a, b = _peer(0, 2, store), _peer(1, 2, store)
    a.issued = b.issued = lambda: {"pg:0": 9}
    a.mark(4), b.mark(4)
    text = str(a.watcher.explain(RuntimeError("Timed out waiting 5000ms for recv operation to complete")))
    a.close(), b.close()
    assert "no rank is behind in steps or in collectives issued" in text and "did not arrive" not in text
    assert "Python stack" not in text


def test_64_ranks_records_are_read_in_two_requests_and_a_missing_one_is_named(monkeypatch):
    """Every waiting rank reads every rank's record when a collective times out: at 1,024 ranks two requests
    per rank each, from every rank at once, was two million requests to rank 0's store."""
    monkeypatch.setattr(hangwatch, "STACKS_WAIT_S", 0.0)  # rank 7 has no heartbeat to send its stacks
    server = _store()
    for rank in range(64):
        if rank != 41:
            server.set(
                f"trainscale/progress/{rank}",
                json.dumps({"step": 9, "issued": {"pg:0": 20 if rank != 7 else 19}, "beat": 1}),
            )
    reader = _peer(0, 64, Counting(server))
    reader._own = True  # a connection of its own, as under torch >= 2.5 (no timeout to put back)
    raws = reader.watcher._read_records()
    assert raws[41] is None and raws[7]["issued"] == {"pg:0": 19} and len(raws) == 64  # rank 41 never published
    server.set("trainscale/progress/41", json.dumps({"step": 9, "issued": {"pg:0": 20}, "beat": 1}))
    reader.store.calls.clear()
    reader.step, reader.issued = 9, lambda: {"pg:0": 20}
    verdict = reader.watcher.diagnose_now()
    reads = [call for call in reader.store.calls if call in ("check", "multi_get", "get")]
    assert reads == ["check", "multi_get"], reader.store.calls
    assert verdict.culprits == [7] and "rank(s) 7 did not arrive" in verdict.text()


def test_a_rank_never_names_itself_from_a_stale_copy_of_its_own_record(monkeypatch):
    """A store set is not acknowledged, so the store's copy of the reading rank's record may be a heartbeat
    old: under load rank 0 named itself with the hung rank ("rank(s) 0, 1 did not arrive")."""
    monkeypatch.setattr(hangwatch, "STACKS_WAIT_S", 0.1)
    server = _store()
    server.set("trainscale/progress/0", json.dumps({"step": 2, "issued": {"pg:0": 8}}))  # stale
    server.set("trainscale/progress/1", json.dumps({"step": 2, "issued": {"pg:0": 8}}))  # hung
    reader = _peer(0, 2, server)
    reader._own = True
    reader.step, reader.op = 2, "op"
    reader.issued = lambda: {"pg:0": 9}  # it has issued one more collective since it last published
    assert reader.watcher.diagnose_now().culprits == [1]


def test_an_unreachable_store_names_rank_zero_at_once():
    """srun mode: rank 0 hosts the store; a stopped rank 0 makes every read fail. The reader gives up after one
    failed request (not one timeout per rank) and names rank 0."""

    class Gone:
        timeout = datetime.timedelta(seconds=5)

        def __getattr__(self, name):
            def fail(*args):
                raise RuntimeError("Connection refused")

            return fail

    reader = _peer(1, 8, Gone())
    reader._own = True
    assert reader.watcher._read_records() == {rank: UNREACHABLE for rank in range(8)}
    reader.step, reader.issued = 3, lambda: {"pg:0": 5}
    verdict = reader.watcher.diagnose_now()
    assert verdict.kind == "unresponsive" and verdict.culprits == [0], verdict.text()


def test_the_watch_gives_one_notice_per_hang_to_its_listeners(capsys):
    """Rank 0 waits in a collective past the notice interval while rank 1 has issued one fewer: one notice (on
    stderr and to the listeners), however often the watch looks; progress again clears it for the next hang."""
    store = _store()
    watcher, hung = _peer(0, 2, store, notice_s=0.5), _peer(1, 2, store)
    watcher.issued, hung.issued = (lambda: {"pg:0": 8}), (lambda: {"pg:0": 7})
    heard = []
    watcher.listeners.append(heard.append)
    hung.mark(3)
    hung._publish(0.0)
    now = watcher._changed_at + 5.0  # rank 0 has been stalled 5 s: it publishes its ledger and looks
    watcher.step = 3
    ledger_entry = {
        "pg": "pg:0",
        "seq": 8,
        "op": "all_reduce",
        "sizes": [[354]],
        "site": "train.py:40 in main",
        "age_s": 5.0,
        "done": False,
    }
    watcher._ledger = lambda *args: [ledger_entry]
    watcher._progress = (3, {"pg:0": 8})
    for _ in range(3):
        watcher.watcher._next_look = 0.0
        watcher.watcher.look(now)
    hung.close()
    assert len(heard) == 1 and heard[0].culprits == [1] and heard[0].kind == "missing"
    err = capsys.readouterr().err
    assert err.count("trainscale: hang: rank(s) 0 waited 5s in all_reduce of shape [354]") == 1, err
    watcher.watcher.look(watcher._changed_at + 0.1)  # progress again
    assert watcher.watcher.noticed is None


def test_the_watch_times_a_collective_from_when_it_was_queued_as_nccls_watchdog_does(capsys):
    """A host that ran ahead of its GPU queued the stuck all-reduce long before its own progress stalled: the
    watch ends the process at the collective's age reaching the timeout, not a host stall's (NCCL's watchdog
    waits only 30 s more: issue 39 defect 6)."""
    store = _store()
    watcher, hung = _peer(0, 2, store, watch=True, notice_s=0), _peer(1, 2, store)
    watcher.issued, hung.issued = (lambda: {"pg:0": 8}), (lambda: {"pg:0": 7})
    hung.mark(3)
    hung._publish(0.0)
    fired = []
    watcher.on_hang = fired.append
    watcher.step, watcher._progress = 3, (3, {"pg:0": 8})
    now = watcher._changed_at + 3.0  # its own progress stalled 3 s ago; the collective was queued 4 s ago
    queued = {
        "pg": "pg:0",
        "seq": 8,
        "op": "all_reduce",
        "sizes": [[354]],
        "site": "train.py:40 in main",
        "age_s": 4.0,
        "done": False,
    }
    watcher._detail = (now, {"ledger": [queued], "stacks": ""})
    watcher._ledger = lambda *args: [queued]
    watcher.watcher._next_look = 0.0
    watcher.watcher.look(now)
    assert fired == []  # 4 s of the 5 s timeout
    watcher.watcher._next_look = 0.0
    watcher.watcher.look(now + 1.5)  # 5.5 s queued, 4.5 s stalled
    hung.close()
    assert len(fired) == 1 and "rank(s) 1" in str(fired[0]), fired


def test_a_channel_of_a_destroyed_group_is_not_counted():
    """comm_hook=shm's barrier count belongs to its process group: after that group is destroyed (a run
    over, the hook not yet garbage collected), the next run's ranks must not compare its old counts (two
    runs in one process named the waiting rank itself as behind)."""
    import torch.distributed as dist

    class Channel:
        collectives = 5

    channel = Channel()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        ledger.track("shm:old", channel, dist.group.WORLD)
        assert ledger.issued()["shm:old"] == 5
    finally:
        dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert "shm:old" not in ledger.issued()
    finally:
        dist.destroy_process_group()


def test_the_heartbeat_imports_nothing_while_the_script_may_be_importing():
    """A module imported from the heartbeat's thread while the script's main thread imports the same modules is
    left half-initialised in one of them: a loaded SLURM job's DDP constructor failed with "cannot import name
    'IndentedBuffer' from partially initialized module 'torch._inductor.utils'" when the flight recorder's dump
    symbolised its stack traces (800 modules, torch._dynamo among them). A stalled rank's whole record, built
    in a fresh interpreter, imports no module."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import datetime, os, sys, threading
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="0", TORCH_FR_BUFFER_SIZE="64")
        import torch, torch.distributed as dist
        from types import SimpleNamespace
        from trainscale.runtime.hangwatch.heartbeat import Heartbeat
        store = dist.TCPStore("127.0.0.1", 0, world_size=1, is_master=True)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        dist.all_reduce(torch.ones(3))
        beat = Heartbeat(SimpleNamespace(is_distributed=False, rank=0, world_size=2,
                                         timeout=datetime.timedelta(seconds=5)))
        beat.store = store
        before, records = set(sys.modules), []
        def look():  # from a thread of its own, as the heartbeat: stalled 10 s, its ledger and every thread's stack
            records.extend([beat._record(beat._changed_at + 10), beat._record(beat._changed_at + 20)])
        thread = threading.Thread(target=look)
        thread.start(); thread.join()
        assert records[-1]["ledger"] and "Thread MainThread (main)" in records[-1]["stacks"], records
        print(sorted(set(sys.modules) - before))
        dist.destroy_process_group()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_the_hang_timeout_ends_a_waiting_rank_and_by_default_only_once_training_steps_ran(monkeypatch):
    """issue 46 item 5: `--hang-timeout S` ends the job after S s with no progress (the waiting rank ends with the
    verdict), from the first collective on; without it, 10 minutes counted only once training steps ran, so a
    rank-0 download behind a barrier before training (every rank at step -1) is not ended by the default."""
    monkeypatch.delenv(progress.HANG_TIMEOUT_VAR, raising=False)
    assert progress.hang_timeout() == (600.0, False)
    monkeypatch.setenv(progress.HANG_TIMEOUT_VAR, "10")
    assert progress.hang_timeout() == (10.0, True)
    store = _store()
    for limit, step, behind, ends in (
        ((600.0, False), -1, 1, False),
        ((600.0, False), 0, 1, True),
        ((10.0, True), -1, 1, True),
        ((10.0, True), 0, 0, True),
    ):  # 0 behind: stuck
        watcher, hung = _peer(0, 2, store, notice_s=0), _peer(1, 2, store)
        watcher.hang_timeout = limit
        watcher.issued, hung.issued = (lambda: {"pg:0": 8}), (lambda behind=behind: {"pg:0": 8 - behind})
        hung.mark(step)
        hung._publish(0.0)
        fired = []
        watcher.on_hang = fired.append
        watcher.step, watcher._progress = step, (step, {"pg:0": 8})
        queued = {
            "pg": "pg:0",
            "seq": 8,
            "op": "barrier",
            "sizes": None,
            "site": "train.py:12 in main",
            "age_s": 1.0,
            "done": False,
        }
        watcher._ledger = lambda *args, queued=queued: [queued]
        watcher.watcher._next_look = 0.0
        watcher.watcher.look(watcher._changed_at + limit[0] + 1)
        hung.close()
        assert len(fired) == ends, (limit, step, fired)
        if ends:
            assert f"no progress for {limit[0] + 1:.0f}s" in str(fired[0])
            assert ("rank(s) 1 did not arrive" if behind else "the collective itself is stuck") in str(fired[0])


def test_a_negative_hang_timeout_is_refused_before_launch(tmp_path):
    import pytest

    from trainscale.errors import ConfigError
    from trainscale.launch.local import LocalLaunchSpec

    script = tmp_path / "train.py"
    script.write_text("")
    with pytest.raises(ConfigError, match=r"--hang-timeout -5 must be 0 \(never\) or more seconds"):
        LocalLaunchSpec(target=str(script), hang_timeout_s=-5)
    assert LocalLaunchSpec(target=str(script), hang_timeout_s=0).hang_timeout_s == 0


def test_the_heartbeat_thread_works_on_the_ranks_gpu_on_nccl(monkeypatch):
    """NCCL's flight recorder queries its CUDA events from the heartbeat's thread, whose current GPU would be
    GPU 0 (a context there from every rank): the thread sets the rank's own GPU first (issue 47 N1)."""
    import threading

    import torch

    chosen = []
    monkeypatch.setattr(
        hangwatch.torch.cuda, "set_device", lambda device: chosen.append((threading.current_thread().name, device))
    )
    beat = _peer(0, 1, _store())
    beat.runtime.uses_nccl, beat.runtime.device = True, torch.device("cuda", 3)
    beat.mark(0)
    beat.close()
    assert chosen == [("trainscale-heartbeat", torch.device("cuda", 3))]


def test_a_collective_called_from_python_is_placed_where_it_was_issued_even_once_done():
    """issue 46 item 4: gloo completes a rank's extra all-reduce against the others' next one and the rank goes
    on, so where its main thread is now is not where the extra collective came from. Each collective called from
    Python is placed at the call (a group given by position or keyword, or the default one); undone, torch's own
    functions are back."""
    import torch
    import torch.distributed as dist

    before = dist.all_reduce, dist.distributed_c10d.all_reduce, dist.barrier
    undo = ledger.record_sites()
    # placed (by this or an earlier start of observation in this process), and wrapped once when started twice
    assert getattr(dist.all_reduce, "_trainscale_sited", False) and ledger.record_sites()() == []
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        world = dist.group.WORLD
        name = world.group_name
        dist.all_reduce(torch.ones(2))
        first = world._get_sequence_number_for_group()
        dist.all_reduce(torch.ones(2), dist.ReduceOp.SUM, world)
        dist.barrier(group=world)
        dist.all_gather_object([None], 1, group=world)  # its own all_gathers inside: the places above stay
        places = [ledger.issued_at(name, seq) for seq in range(first, first + 3)]
        assert all(p and "test_progress.py:" in p and "in test_a_collective_called" in p for p in places), places
        lines = [int(p.split("test_progress.py:")[1].split()[0]) for p in places]
        assert lines[0] < lines[1] < lines[2]  # each at its own line
        assert ledger.issued_at(name, first + 9) is None  # not issued yet
        # as the flight recorder names them: a number's place is its own collective's (the dump's done entries get
        # theirs so: tests/integration/test_desync.py, whose 4-rank `extra` is placed where rank 1 issued it)
        assert ledger.issued_at(name, first + 2, "gloo:barrier") == places[2]
        assert ledger.issued_at(name, first + 1, "gloo:all_reduce") == places[1]
        assert ledger.issued_at(name, first + 2, "gloo:all_reduce") is None  # another op under that number
        assert ledger.issued_at(name, first + 2, "nccl:all_reduce") == places[2]  # NCCL's barrier is an all-reduce
        gathered = world._get_sequence_number_for_group() + 1
        dist.all_gather_into_tensor(torch.zeros(2), torch.ones(2), group=world)
        # the flight recorder's name for it (ProcessGroupNCCL's): a review found its place dropped
        assert "test_progress.py:" in (ledger.issued_at(name, gathered, "nccl:_all_gather_base") or "")
    finally:
        dist.destroy_process_group()
        undo()
    assert (dist.all_reduce, dist.distributed_c10d.all_reduce, dist.barrier) == before


def test_a_step_boundary_a_peer_had_not_published_yet_is_compared_again_at_the_next_beat():
    """Rank 0 ends step 4 before rank 1's record says it did: the comparison waits for rank 1's, so a desync at
    that boundary is named at once, not only once rank 0 stalls (the fresh-clone CI's silent desync once waited
    out its test)."""
    store = _store()
    watcher, peer = _peer(0, 2, store, notice_s=30), _peer(1, 2, store)
    watcher.issued = peer.issued = lambda: {"pg:0": 0}
    fired = []
    watcher.on_hang = fired.append
    watcher.counts.extend([[3, 12], [4, 16]])
    peer.counts.append([3, 12])
    peer._publish(0.0)
    now = watcher._changed_at + 0.5  # not stalled
    watcher.watcher.look(now)
    assert fired == []  # rank 1 has not ended step 4 as far as its record says
    peer.counts.append([4, 15])
    peer._publish(1.0)
    watcher.watcher.look(now + 0.5)
    peer.close()
    watcher._stop.set()
    assert len(fired) == 1 and "by the end of step 4" in str(fired[0]) and "rank(s) 1" in str(fired[0]), fired


def test_a_heartbeat_whose_record_fails_says_so_instead_of_passing_for_a_silent_rank(monkeypatch, capsys):
    """A bug in what a stalled rank adds to its record (its ledger) ended the thread quietly, as a store gone at
    teardown does: the rank then read as one that stopped responding, and its desync went unnamed."""
    beat = _peer(0, 1, _store())
    first = beat._record
    calls = iter([first])  # the record published at the start; the heartbeat thread's next one fails
    monkeypatch.setattr(beat, "_record", lambda now: next(calls, lambda now: {}["no such key"])(now))
    beat.mark(1)
    beat._thread.join(5)
    assert not beat.beating
    beat.close()
    assert "trainscale: the heartbeat stopped: KeyError: 'no such key'" in capsys.readouterr().err


class _Failing:
    """A real store whose writes fail from now on with ``error`` (a connection that broke)."""

    def __init__(self, store, error) -> None:
        self.store, self.error, self.timeout = store, error, store.timeout

    def set(self, *args):
        raise self.error("Broken pipe")

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_a_heartbeat_that_stopped_writing_its_record_says_why_in_its_timeouts_verdict(capsys):
    """A failed write ends the heartbeat quietly (the store gone at teardown), and rank 0's watch with it. In one
    loaded CI run rank 0's stopped early, why unknown: the hang had no notice, and its timeout's verdict did not
    say the watch had stopped. Now it does, with the store's error."""
    import torch.distributed as dist

    store = _store()
    waiting, hung = _peer(0, 2, store).start(), _peer(1, 2, store)
    waiting.issued, hung.issued = (lambda: {"pg:0": 8}), (lambda: {"pg:0": 7})
    waiting.store = _Failing(store, dist.DistNetworkError)
    waiting.step = 3  # a new record to write: the next beat's write fails
    waiting._thread.join(10)
    assert not waiting.beating and waiting.stopped == "DistNetworkError: Broken pipe"
    assert "trainscale" not in capsys.readouterr().err
    hung.mark(3)
    text = str(waiting.watcher.explain(RuntimeError("[gloo/transport/tcp/pair.cc:534] Timed out waiting 5000ms")))
    waiting.close(), hung.close()
    assert "within 5s (this rank's heartbeat had stopped writing its record: DistNetworkError: Broken pipe)" in text
    assert "rank(s) 1 did not arrive" in text


def test_a_heartbeat_whose_group_is_gone_says_so_in_its_timeouts_verdict():
    """The heartbeat's other quiet end: its process group no longer in torch's list (the script destroyed it).
    Quiet, and said in the rank's verdict, so that a watch that ended early is never unexplained."""
    store = _store()
    waiting, hung = _peer(0, 2, store), _peer(1, 2, store)
    waiting.group = object()  # a group torch does not know (here: no process group at all)
    waiting.issued, hung.issued = (lambda: {"pg:0": 8}), (lambda: {"pg:0": 7})
    waiting.start()._thread.join(10)
    assert not waiting.beating and "process group was no longer" in waiting.stopped
    text = str(waiting.watcher.explain(RuntimeError("[gloo/transport/tcp/pair.cc:534] Timed out waiting 5000ms")))
    waiting.close(), hung.close()
    assert "this rank's heartbeat had stopped writing its record: its process group was no longer" in text, text


def test_a_timeout_is_explained_where_the_rank_waited_and_for_as_long_even_when_its_record_is_stale():
    """The collective's error reaches the main thread after it left the collective: the verdict places the wait at
    the error's innermost frame (not where the main thread is now, the launcher's except) and says it lasted the
    whole timeout, whatever the heartbeat's last record says (seen in CI: "waited 0s ..., issued at
    bootstrap.py:185")."""
    store = _store()
    waiting, hung = _peer(0, 2, store), _peer(1, 2, store)
    waiting.issued, hung.issued = (lambda: {"pg:0": 8}), (lambda: {"pg:0": 7})
    waiting.mark(3), hung.mark(3)

    def all_reduce_here():
        raise RuntimeError("[gloo/transport/tcp/pair.cc:534] Timed out waiting 5000ms for recv")

    try:
        all_reduce_here()
    except RuntimeError as exc:
        error = exc
    text = str(waiting.watcher.explain(error))
    waiting.close(), hung.close()
    assert "rank(s) 0 waited 5s in a collective (collective #8 of process group 0), issued at " in text, text
    assert "in all_reduce_here — rank(s) 1 did not arrive" in text, text
