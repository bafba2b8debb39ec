"""The launcher's line for a run that ended well: "finished" where a rank recorded an optimizer step, "ended
without training" where the records say none did, and "finished" where the records were off (nothing says)."""

from __future__ import annotations

import types

import pytest

from trainscale.launch.summary import finished_lines


@pytest.mark.parametrize(
    ("recorded", "record_var", "said"),
    [
        (True, None, "2 rank(s) finished in 1.5s; run directory"),
        (False, None, "2 rank(s) ended without training: no rank ran an optimizer step"),
        (False, "0", "2 rank(s) finished in 1.5s; run directory"),
    ],
)
def test_a_finished_runs_line_says_what_its_records_say(tmp_path, monkeypatch, recorded, record_var, said):
    if recorded:
        (tmp_path / "metrics").mkdir()
        (tmp_path / "metrics" / "rank-0.jsonl").write_text("{}\n")
    if record_var is None:
        monkeypatch.delenv("TRAINSCALE_RECORD", raising=False)
    else:
        monkeypatch.setenv("TRAINSCALE_RECORD", record_var)
    result = types.SimpleNamespace(run_dir=tmp_path, log_dir=tmp_path, seconds=1.5, attempts=[])
    line = finished_lines(2, 0, result).splitlines()[0]
    assert said in line, line
    assert ("step records, " in line) == recorded, line
