"""``--metrics-out`` (train/metrics.py): another run's results are never overwritten, and the file's
mode is what the user expects of a file they asked for (docs/workloads.md)."""

from __future__ import annotations

import json
import os
import stat
from types import SimpleNamespace

import pytest

from trainscale.cli.main import main
from trainscale.errors import ConfigError
from trainscale.train.metrics import check_metrics_out, write_metrics

MAIN = SimpleNamespace(is_main=True)


def test_an_existing_file_is_refused_before_launch_unless_the_run_resumes(in_tmp, capsys):
    (in_tmp / "m.json").write_text('{"mine": true}')
    cnn = ["run", "--nproc-per-node", "2", "--log-dir", "logs", "--workload", "cnn", "--data", "synthetic",
           "--samples", "64", "--batch-size", "16", "--metrics-out", "m.json"]
    assert main(cnn) == 2
    err = capsys.readouterr().err
    assert "--metrics-out m.json already exists" in err and "Hint:" in err and "Traceback" not in err
    assert not (in_tmp / "logs").exists() and json.loads((in_tmp / "m.json").read_text()) == {"mine": True}
    # the same run resuming (its checkpoint directory holds a checkpoint) brings its own file up to date
    (in_tmp / "ckpt").mkdir()
    (in_tmp / "ckpt" / "ckpt-00000004.pt").write_bytes(b"")
    check_metrics_out(in_tmp / "m.json", resuming=True)
    with pytest.raises(ConfigError, match="is a directory"):
        check_metrics_out(in_tmp / "ckpt", resuming=True)


def test_a_new_file_gets_the_umask_mode_and_an_updated_one_keeps_its_own(tmp_path):
    old = os.umask(0o027)
    try:
        write_metrics(tmp_path / "new.json", {"steps": 1}, MAIN)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o640  # as open() would create it
    shared = tmp_path / "shared.json"
    shared.write_text("{}")
    shared.chmod(0o664)
    write_metrics(shared, {"steps": 2}, MAIN)
    assert stat.S_IMODE(shared.stat().st_mode) == 0o664 and json.loads(shared.read_text()) == {"steps": 2}
