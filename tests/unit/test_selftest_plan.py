"""`trainscale selftest`'s decisions on plain data: the hang verdict, its options, its output directory."""

from __future__ import annotations

import json

import pytest

from trainscale.cli.main import main
from trainscale.doctor.selftest import hang_record, hang_row, out_directory
from trainscale.errors import ConfigError


def test_a_hang_that_is_not_named_or_too_late_fails(tmp_path):
    path = tmp_path / "hang.json"
    named = "rank(s) 1 did not arrive\nrank 1's Python stack ...\n  in stop_participating"

    def verdict(*records: dict) -> str:
        for old in tmp_path.glob("hang.rank*.json"):
            old.unlink()
        for rank, record in enumerate(records):
            hang_record(path, rank).write_text(json.dumps({"hung_rank": 1, "backend": "nccl", **record}))
        return hang_row(path, 5.0, (False, ""))["status"]

    assert verdict({"seconds": 5.0, "message": "Timed out"}) == "fail"
    assert verdict({"seconds": 70.0, "message": named}) == "fail"
    assert verdict({"seconds": 6.0, "message": "rank(s) 1 did not arrive"}) == "fail"  # no stack
    assert verdict({"seconds": 6.0, "message": named}) == "pass"
    # every waiting rank records; any one that names the hung rank with its stack will do
    assert verdict({"seconds": 5.5, "message": "Connection closed by peer"}, {"seconds": 6.0, "message": named}) == "pass"
    assert hang_row(tmp_path / "missing.json", 5.0, (True, ""))["status"] == "fail"


@pytest.mark.parametrize("argv, message", [
    (["--skip", "resum"], "--skip 'resum' is not a selftest check"),
    (["--nodes", "2"], "--nodes 2 needs --slurm"),
    (["--profile", "lumi"], "--profile only apply with --slurm"),
    (["--slurm", "--profile", "lumi"], "--slurm needs --profile and --time"),
])
def test_bad_options_are_refused_before_anything_runs(in_tmp, capsys, argv, message):
    assert main(["selftest", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Hint:" in err
    assert not (in_tmp / "selftest-out").exists()


def test_an_existing_report_directory_is_never_overwritten(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "selftest.json").write_text("{}")
    with pytest.raises(ConfigError, match="already exists and is not empty"):
        out_directory(tmp_path / "old")
    assert out_directory(tmp_path / "new") == tmp_path / "new"
