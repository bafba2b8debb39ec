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
    cnn = [
        "run",
        "--nproc-per-node",
        "2",
        "--log-dir",
        "logs",
        "--workload",
        "cnn",
        "--data",
        "synthetic",
        "--samples",
        "64",
        "--batch-size",
        "16",
        "--metrics-out",
        "m.json",
    ]
    assert main(cnn) == 2
    err = capsys.readouterr().err
    assert "--metrics-out m.json already exists" in err and "Hint:" in err and "Traceback" not in err
    assert not (in_tmp / "logs").exists() and json.loads((in_tmp / "m.json").read_text()) == {"mine": True}
    # a run resuming any checkpoint overwrote it (issue 35 item 4): the file must say it was written for those
    (in_tmp / "ckpt").mkdir()
    (in_tmp / "ckpt" / "ckpt-00000004.pt").write_bytes(b"")
    with pytest.raises(ConfigError, match="already exists and this run does not resume the one that wrote it"):
        check_metrics_out(in_tmp / "m.json", resuming=True, checkpoints=in_tmp / "ckpt")
    resumed = [*cnn, "--checkpoint-dir", "ckpt"]
    assert main(resumed) == 2 and json.loads((in_tmp / "m.json").read_text()) == {"mine": True}
    # the run that wrote it, resuming from the same checkpoints, brings its own file up to date
    write_metrics(in_tmp / "ours.json", {"steps": 4}, MAIN, checkpoints=in_tmp / "ckpt")
    check_metrics_out(in_tmp / "ours.json", resuming=True, checkpoints=in_tmp / "ckpt")
    with pytest.raises(ConfigError, match="already exists"):  # ... and only that run
        check_metrics_out(in_tmp / "ours.json", resuming=True, checkpoints=in_tmp / "other")
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
    assert stat.S_IMODE(shared.stat().st_mode) == 0o664
    assert json.loads(shared.read_text()) == {"steps": 2, "checkpoints_of": None}
