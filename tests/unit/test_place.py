"""The place in the user's code a late rank's time goes (observe/place.py): the innermost frame of the user's
code in a real stack, the majority rule per phase, and the sampler thread on a flagged rank."""

from __future__ import annotations

import copy
import sys
import types

import pytest

from trainscale.observe import place
from trainscale.observe.records import RankRecorder, read_run


def _frame_inside(library: str) -> types.FrameType:
    """A real stack whose innermost frames are the standard library's (copy) or torch's (pytree), called from
    this test's own function."""

    class Grab:
        def __deepcopy__(self, memo):
            return sys._getframe(1)  # copy.deepcopy's frame

    if library == "stdlib":
        return copy.deepcopy(Grab())  # line: stdlib
    from torch.utils import _pytree

    return _pytree.tree_map(lambda _: sys._getframe(1), [0])[0]  # a frame of torch's; line: torch


@pytest.mark.parametrize("library", ["stdlib", "torch"])
def test_the_innermost_frame_of_the_users_code_is_the_place(library):
    frame = _frame_inside(library)
    assert frame.f_code.co_filename != __file__
    function, path, line = place.user_site(frame, place.not_users())
    assert (function, path) == ("_frame_inside", __file__)  # torch's and the library's frames skipped
    marked = next(
        n for n, text in enumerate(open(__file__).read().splitlines(), 1) if text.endswith(f"line: {library}")
    )
    assert line == marked
    assert place.user_site(sys._getframe(), place.not_users())[0] == (
        "test_the_innermost_frame_of_the_users_code_is_the_place"
    )  # a user's frame is its own place


def _samples(**counts: int) -> list:
    """``phase_function_line=n``: n samples in that phase at that function and line ('none': no user frame)."""
    out = []
    for key, n in counts.items():
        phase, function, line = key.split("_")
        out += [(phase, None if function == "none" else (function, "train.py", int(line)))] * n
    return out


def test_a_place_needs_a_clear_majority_of_the_phases_samples():
    found = place.choose(
        _samples(between_getbatch_121=14, between_getbatch_122=7, between_loss_90=9, forward_model_10=100), "between"
    )
    assert found == {"function": "getbatch", "file": "train.py", "line": 121, "share": 0.7, "samples": 30}
    # half the samples: no place; samples without a user frame count against it
    assert place.choose(_samples(between_getbatch_121=15, between_loss_90=15), "between") is None
    assert place.choose(_samples(between_getbatch_121=15, between_none_0=15), "between") is None
    assert place.choose(_samples(between_getbatch_121=19), "between") is None  # too few samples
    assert place.choose(_samples(forward_model_10=100), "between") is None  # none in the phase
    # the DataLoader's time lies in the data phase or between forward and backward; "unexplained": all
    loader = place.choose(_samples(data_collate_5=20, between_collate_5=20, forward_model_10=10), "loader")
    assert loader["function"] == "collate" and loader["samples"] == 40
    assert place.choose(_samples(data_collate_5=20, forward_model_10=30), "unexplained")["function"] == "model"


def _users_own_work(out: RankRecorder) -> None:
    while "place" not in out.window.meta:  # the user's code, busy until the sampler has its place
        sum(range(1000))


def test_a_flagged_rank_samples_its_main_thread_and_records_the_place(tmp_path, monkeypatch):
    monkeypatch.setattr(place, "POLL_S", 0.01)
    monkeypatch.setattr(place, "SAMPLES", 40)
    out = RankRecorder(tmp_path, 1, store=None)
    recorder = types.SimpleNamespace(run_dir=str(tmp_path), marks=None, out=out)
    sampler = place.StackSampler(recorder, 1).start()
    place.flag(tmp_path, 1).touch()
    _users_own_work(out)
    sampler.stop()
    out.close()
    (record,) = [r for r in read_run(tmp_path)["ranks"][1] if r["kind"] == "place"]
    assert record["samples"] == 40 and record["places"] == out.window.meta["place"]
    found = record["places"]["data"]  # no step marks yet: the data phase
    assert (found["function"], found["line"]) == ("_users_own_work", _users_own_work.__code__.co_firstlineno + 2)
    assert found["file"].endswith("test_place.py")


def test_an_unflagged_rank_never_samples(tmp_path, monkeypatch):
    monkeypatch.setattr(place, "POLL_S", 0.01)
    out = RankRecorder(tmp_path, 0, store=None)
    sampler = place.StackSampler(types.SimpleNamespace(run_dir=str(tmp_path), marks=None, out=out), 0).start()
    sampler.stop()
    assert "place" not in out.window.meta and not sampler._thread.is_alive()
