"""The step heartbeat: publishes progress to a real store and is gone once closed; who is behind; the
stack a hung rank's heartbeat sends on request; the diagnosis a peer relays."""

from __future__ import annotations

import datetime
import json
from types import SimpleNamespace

from torch.distributed import TCPStore

from trainscale.runtime import peers, progress
from trainscale.runtime.progress import UNREACHABLE, ProgressTracker, Seen, behind
from helpers.counting_store import Counting


def _tracker():
    runtime = SimpleNamespace(is_distributed=False, rank=0, world_size=1, timeout=datetime.timedelta(seconds=5))
    tracker = ProgressTracker(runtime)
    tracker.store = TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=datetime.timedelta(seconds=5))
    return tracker


def test_heartbeat_publishes_the_step_and_is_joined_on_close():
    """A heartbeat left running into interpreter shutdown aborts the process (SIGABRT) after a good run."""
    tracker = _tracker()
    tracker.mark(7, "gradient all-reduce")
    assert tracker.beating
    assert json.loads(tracker.store.get("trainscale/progress/0")) == {"step": 7, "op": "gradient all-reduce",
                                                                      "issued": {}}
    tracker.close()
    assert not tracker.beating


def test_others_reports_every_rank_record():
    tracker = _tracker()
    tracker.mark(3)
    assert tracker.others() == {0: Seen(3, "gradient all-reduce", {})}
    tracker.close()


def test_every_way_gloo_words_a_timeout_is_explained_and_other_errors_are_not():
    """With several DDP buckets, the bucket that surfaces first may be one whose pair an earlier
    bucket's timeout closed: gloo then says "Application timeout caused pair closure" (seen in CI)."""
    runtime = SimpleNamespace(is_distributed=True, rank=0, world_size=2, timeout=datetime.timedelta(seconds=5))
    tracker = ProgressTracker(runtime)
    tracker.store = TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=datetime.timedelta(seconds=5))
    tracker.mark(3)
    for text in ("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out waiting 5000ms for recv operation",
                 "Application timeout caused pair closure"):
        explained = tracker.explain(RuntimeError(text))
        assert explained is not None and "rank(s) 1 did not arrive" in str(explained), text
    assert tracker.explain(RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x8 and 6x2)")) is None
    tracker.close()


def test_a_rank_in_the_same_step_with_fewer_collectives_is_behind():
    """Hung inside the step: the waiting ranks issued the all-reduce, it did not (issue 20 item 4)."""
    waiting = Seen(5, "op", {"pg:0": 12, "shm:x": 40})
    assert behind({0: waiting, 1: Seen(5, "op", {"pg:0": 11, "shm:x": 40}), 2: waiting}, 5) == [1]
    assert behind({0: waiting, 1: Seen(5, "op", {"pg:0": 12, "shm:x": 38})}, 5) == [1]  # comm_hook=shm
    assert behind({0: waiting, 1: Seen(4, "op", {"pg:0": 12, "shm:x": 40})}, 5) == [1]  # before the step
    assert behind({0: waiting, 1: None}, 5) == [1]
    assert behind({0: waiting, 1: waiting, 2: UNREACHABLE}, 5) == []  # in step: a long evaluation everywhere
    # of two laggards the farthest back holds the other up (the other waits in a collective it issued)
    assert behind({0: waiting, 1: Seen(5, "op", {"pg:0": 10}), 2: Seen(5, "op", {"pg:0": 11})}, 5) == [1]
    # a group only some ranks belong to compares those ranks only
    assert behind({0: Seen(5, "op", {"pg:0": 3, "pg:1": 7}), 1: Seen(5, "op", {"pg:0": 3})}, 5) == []


def _peer(rank: int, world: int, store) -> ProgressTracker:
    runtime = SimpleNamespace(is_distributed=False, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=5))
    tracker = ProgressTracker(runtime)
    tracker.store = store
    return tracker


def test_the_error_names_the_hung_rank_with_the_stack_its_heartbeat_sends():
    """Rank 1's heartbeat answers rank 0's request with its main thread's stack: this test's, which waits in
    peers.request. Its record says step 3 with one all-reduce fewer than rank 0."""
    store = TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=datetime.timedelta(seconds=5))
    waiting, hung = _peer(0, 2, store), _peer(1, 2, store)
    waiting.issued, hung.issued = (lambda: {"pg:0": 8}), (lambda: {"pg:0": 7})
    waiting.mark(3)
    hung.mark(3)
    error = waiting.explain(RuntimeError("[gloo/transport/tcp/pair.cc:534] Timed out waiting 5000ms for recv"))
    waiting.close(), hung.close()
    text = str(error)
    assert "rank 0: gradient all-reduce at step 3 did not complete within 5s — rank(s) 1 did not arrive" in text
    assert "rank 1: step 3, 1 collective(s) behind; rank 0: step 3" in text
    assert "rank 1's Python stack (main thread, innermost last):" in text and ", in request\n" in text
    assert "in test_the_error_names_the_hung_rank_with_the_stack_its_heartbeat_sends" in text
    assert peers.await_diagnosis(store, 0) == text.split("\nHint:")[0]  # posted for the peers to relay


def test_a_peer_whose_connection_a_timed_out_rank_closed_relays_its_diagnosis(monkeypatch):
    """gloo: the rank that timed out closes its connections; its peers fail at once with "Connection closed
    by peer". They carry the diagnosis it posted; after a peer that crashed (nothing posted) the error stays."""
    monkeypatch.setattr(peers, "WAIT_S", 0.2)
    store = TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=datetime.timedelta(seconds=5))
    peer = _peer(2, 4, store)
    peer.mark(3)
    closed = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:27530")
    assert peer.explain(closed) is None
    peers.post(store, "rank 0: step 3 did not complete within 5s — rank(s) 3 did not arrive", complete=False)
    relayed = str(peer.explain(closed))
    assert relayed.startswith("rank 2: gradient all-reduce at step 3 failed: a peer timed out and closed its "
                              "connections; its diagnosis: rank 0: step 3 did not complete within 5s — rank(s) 3 "
                              "did not arrive")
    peer.close()


def test_the_store_timeout_every_later_group_waits_with_is_left_alone():
    """The tracker reads with a short timeout on a connection of its own (issue 22 item 5)."""
    store = TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=datetime.timedelta(minutes=30))
    own, separate = progress._own_connection(store)
    assert separate and own.timeout == progress.READ_TIMEOUT and store.timeout == datetime.timedelta(minutes=30)
    shared = _peer(0, 2, store)  # the fallback on a torch without Store.clone: set for the reads, then put back
    shared.mark(1)
    shared.others()
    assert store.timeout == datetime.timedelta(minutes=30)
    shared.close()


def test_ranks_in_step_with_the_same_collectives_issued_name_nobody():
    """Every rank issued as many collectives, yet one timed out: they wait in different ones (a mismatch),
    which no rank's record can blame; the message says so instead of naming a healthy rank."""
    store = TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=datetime.timedelta(seconds=5))
    a, b = _peer(0, 2, store), _peer(1, 2, store)
    a.issued = b.issued = lambda: {"pg:0": 9}
    a.mark(4), b.mark(4)
    text = str(a.explain(RuntimeError("Timed out waiting 5000ms for recv operation to complete")))
    a.close(), b.close()
    assert "no rank is behind in steps or in collectives issued" in text and "did not arrive" not in text
    assert "Python stack" not in text


def test_64_ranks_records_are_read_in_two_requests_and_a_missing_one_is_named():
    """Every waiting rank reads every rank's record when a collective times out: at 1,024 ranks two requests
    per rank each, from every rank at once, was two million requests to rank 0's store."""
    server = TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=datetime.timedelta(seconds=5))
    for rank in range(64):
        if rank != 41:
            server.set(f"trainscale/progress/{rank}", json.dumps({"step": 9 if rank != 7 else 8, "op": "op",
                                                                  "issued": {}}))
    reader = _peer(0, 64, Counting(server))
    reader._own = True  # a connection of its own, as under torch >= 2.5 (no timeout to put back)
    reader.step = 9  # where the reading rank is (its own record is taken as it is now, not from the store)
    seen = reader._read_all()
    assert seen[41] is None and seen[7] == Seen(8, "op", {}) and len(seen) == 64  # rank 41 never published
    server.set("trainscale/progress/41", json.dumps({"step": 9, "op": "op", "issued": {}}))
    reader.store.calls.clear()
    seen = reader._read_all()
    assert reader.store.calls == ["check", "multi_get"] and behind(seen, 9) == [7], reader.store.calls


def test_a_rank_never_names_itself_from_a_stale_copy_of_its_own_record():
    """A store set is not acknowledged, so the store's copy of the reading rank's record may be a heartbeat
    old: under load rank 0 named itself with the hung rank ("rank(s) 0, 1 did not arrive")."""
    server = TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=datetime.timedelta(seconds=5))
    server.set("trainscale/progress/0", json.dumps({"step": 2, "op": "op", "issued": {"pg:0": 8}}))  # stale
    server.set("trainscale/progress/1", json.dumps({"step": 2, "op": "op", "issued": {"pg:0": 8}}))  # hung
    reader = _peer(0, 2, server)
    reader._own = True
    reader.step, reader.op = 2, "op"
    reader.issued = lambda: {"pg:0": 9}  # it has issued one more collective since it last published
    assert behind(reader._read_all(), 2) == [1]


def test_a_channel_of_a_destroyed_group_is_not_counted():
    """comm_hook=shm's barrier count belongs to its process group: after that group is destroyed (a run
    over, the hook not yet garbage collected), the next run's ranks must not compare its old counts (two
    runs in one process named the waiting rank itself as behind)."""
    import torch.distributed as dist

    from trainscale.runtime.progress import collectives_issued, track

    class Channel:
        collectives = 5

    channel = Channel()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        track("shm:old", channel, dist.group.WORLD)
        assert collectives_issued()["shm:old"] == 5
    finally:
        dist.destroy_process_group()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert "shm:old" not in collectives_issued()
    finally:
        dist.destroy_process_group()
