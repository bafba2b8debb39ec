"""`trainscale run --workload cnn --strategy ...` end to end on 2 ranks: a sharded strategy's
checkpoint saved and resumed through the workload, and the memory report printed and recorded."""

from __future__ import annotations

import json

from integration.test_run_cli import FAST_CNN, trainscale


def test_fsdp_from_the_cli_checkpoints_resumes_and_reports_memory(tmp_path):
    common = [
        "run",
        "--nproc-per-node",
        "2",
        "--log-dir",
        "logs",
        "--workload",
        "cnn",
        "--strategy",
        "fsdp:reshard_after_forward=false",
        "--epochs",
        "1",
        *FAST_CNN,
        "--checkpoint-dir",
        "ckpt",
        "--checkpoint-every",
        "2",
        "--metrics-out",
        "metrics.json",
    ]
    first = trainscale(*common, "--max-steps", "2", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "ckpt" / "ckpt-00000002" / "trainscale.json").is_file()
    console = first.stdout + first.stderr
    assert "memory per rank (fsdp)" in console
    memory = json.loads((tmp_path / "metrics.json").read_text())["memory"]
    assert [r["rank"] for r in memory["ranks"]] == [0, 1]
    assert all(r["params"] > 0 and r["optimizer"] >= 2 * r["params"] for r in memory["ranks"]), memory

    second = trainscale(*common, "--max-steps", "4", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "Resumed from ckpt/ckpt-00000002 at step 2" in second.stdout + second.stderr
    assert json.loads((tmp_path / "metrics.json").read_text())["steps"] == 4
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        ".trainscale.lock",
        "ckpt-00000002",
        "ckpt-00000004",
    ]
