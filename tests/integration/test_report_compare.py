"""`trainscale report RUN --against BASE` on two real runs of a plain DDP script (issue 46 item 9): the phases,
throughput, peak memory and MFU side by side with signed changes, what differs between the runs (ranks, the
environment, the script's contents), and `--max-regression PCT`'s exit status."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from helpers.cli import in_process

SCRIPTS = Path(__file__).resolve().parents[1] / "conformance" / "scripts"


def run(tmp: Path, script: Path, ranks: int, threads: str) -> Path:
    done = in_process(
        "run",
        "--nproc-per-node",
        str(ranks),
        "--log-dir",
        "runs",
        str(script),
        "--experiment-dir",
        "exp",
        "--out",
        f"out-{ranks}",
        cwd=tmp,
        env={"OMP_NUM_THREADS": threads},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return max((tmp / "runs").glob(f"{script.stem}-*"), key=lambda p: p.stat().st_mtime)


@pytest.mark.slow
def test_two_runs_side_by_side_and_a_regression_beyond_the_threshold_fails(tmp_path):
    from trainscale.report.compare import REGRESSED, compare

    for name in ("ddp_torchrun.py", "common_data.py"):
        shutil.copy(SCRIPTS / name, tmp_path / name)
    script = tmp_path / "ddp_torchrun.py"
    first = run(tmp_path, script, 1, "1")
    script.write_text(script.read_text() + "\n# changed\n")  # the script's contents differ too
    second = run(tmp_path, script, 2, "1")

    done = in_process("report", str(second), "--against", str(first), cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout
    for figure in (
        "step time",
        "data wait",
        "forward",
        "backward",
        "optimizer",
        "communication (exposed)",
        "throughput",
        "peak memory",
        "MFU",
    ):
        assert any(line.startswith(figure) for line in said.splitlines()), (figure, said)
    assert "What differs:" in said and "  ranks: 1 -> 2" in said and "  script sha256: " in said
    assert "trainscale:" not in said.split("What differs:")[1]  # the same versions are not listed

    made = compare(str(second), str(first))
    change = made.change("step time")
    slower, faster = (second, first) if change > 0 else (first, second)
    grew = abs(compare(str(slower), str(faster)).change("step time")) * 100
    over = in_process(
        "report", str(slower), "--against", str(faster), "--max-regression", f"{grew / 2:.3f}", cwd=tmp_path
    )
    assert over.returncode == REGRESSED == 3, over.stdout + over.stderr
    assert "REGRESSED beyond --max-regression" in over.stdout
    within = in_process(
        "report", str(slower), "--against", str(faster), "--max-regression", f"{grew * 2 + 1:.3f}", cwd=tmp_path
    )
    assert within.returncode == 0 and "within --max-regression" in within.stdout


def test_max_regression_without_a_base_and_a_study_as_base_are_refused(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "run.json").write_text("{}")
    done = in_process("report", str(tmp_path / "run"), "--max-regression", "10", cwd=tmp_path)
    assert done.returncode == 2 and "no --against was given" in done.stderr
    (tmp_path / "study").mkdir()
    (tmp_path / "study" / "results.json").write_text("{}")
    done = in_process("report", str(tmp_path / "run"), "--against", str(tmp_path / "study"), cwd=tmp_path)
    assert done.returncode == 2 and "--against compares two runs" in done.stderr
