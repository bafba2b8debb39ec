"""The step heartbeat: publishes progress to a real store and is gone once closed."""

from __future__ import annotations

import datetime
from types import SimpleNamespace

from torch.distributed import TCPStore

from trainscale.runtime.progress import ProgressTracker


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
    assert tracker.store.get("trainscale/progress/0") == b"7|gradient all-reduce"
    tracker.close()
    assert not tracker.beating


def test_others_reports_every_rank_record():
    tracker = _tracker()
    tracker.mark(3)
    assert tracker.others() == {0: (3, "gradient all-reduce")}
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
    assert tracker.explain(RuntimeError("Connection closed by peer [127.0.0.1]:4242")) is None
    tracker.close()
