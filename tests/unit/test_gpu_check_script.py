"""scripts/gpu-check.sh, the one command for a bare GPU machine, run for real in its CPU check mode (so that it
cannot rot where no GPU is), and the GPU suite's refusal to pass with every test skipped (tests/gpu/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"
CHEAP_GPU_TEST = "test_all_gpus_visible_local_rank_r_drives_cuda_r"  # passes in the suite's CPU mode in < 1 s
NO_GPU = pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible here: the script runs in full")


def env(**extra: str) -> dict[str, str]:
    """This environment without the outer pytest's and the GPU modes' variables, plus ``extra``."""
    kept = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(
            (
                "PYTEST_",
                "TRAINSCALE_GPU_",
                "TRAINSCALE_WHEELS",
                "RANK",
                "LOCAL_RANK",
                "WORLD_SIZE",
                "MASTER_",
                "TORCHELASTIC",
            )
        )
    }
    return {**kept, "PYTHON": sys.executable, **extra}


def hide_deepspeed(folder: Path) -> str:
    """A PYTHONPATH entry whose sitecustomize hides DeepSpeed from every Python the script starts (as the GPU image,
    which has none): its step must then say so and skip, not time out."""
    folder.mkdir()
    (folder / "sitecustomize.py").write_text(
        "import sys\nfrom importlib.machinery import PathFinder\n\n"
        "class Hidden(PathFinder):\n"
        "    @classmethod\n"
        "    def find_spec(cls, name, path=None, target=None):\n"
        "        return None if name.split('.')[0] == 'deepspeed' else PathFinder.find_spec(name, path, target)\n\n"
        "sys.meta_path[:] = [Hidden if f is PathFinder else f for f in sys.meta_path]\n"
    )
    return str(folder)


def probe_wheel(folder: Path) -> Path:
    """A pure-Python wheel of a distribution nobody has: the script puts it on PYTHONPATH as it is."""
    folder.mkdir()
    wheel = folder / "tsprobe-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as whl:
        whl.writestr("tsprobe.py", "VALUE = 1\n")
        whl.writestr("tsprobe-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: tsprobe\nVersion: 1.0\n")
    return wheel


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_the_cpu_check_mode_runs_every_step_into_a_small_outdir(tmp_path):
    wheel = probe_wheel(tmp_path / "wheels")
    done = subprocess.run(
        ["bash", str(SCRIPT), "out"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=1400,
        env=env(
            TRAINSCALE_GPU_SUITE_ON_CPU="1",
            TRAINSCALE_WHEELS=str(wheel.parent),
            TRAINSCALE_GPU_CHECK_PYTEST_ARGS=f"-k {CHEAP_GPU_TEST}",
            TMPDIR=str(tmp_path),
            PYTHONPATH=hide_deepspeed(tmp_path / "no-deepspeed"),
        ),
    )
    out = tmp_path / "out"
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]

    files = [p.relative_to(out) for p in out.rglob("*") if p.is_file()]
    assert len(files) <= 8 and all(len(f.parts) <= 2 for f in files), files
    assert {str(f) for f in files} == {
        "summary.txt",
        "junit.xml",
        "selftest.json",
        "setup.log",
        "gpu-suite.log",
        "selftest.log",
        "train.log",
    }
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("trainscale-gpu-check")] == []  # removed

    summary = (out / "summary.txt").read_text()
    table = summary.split("\nstep ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]  # the steps' rows
    rows = {line.split()[0]: line.split()[1] for line in table}
    strategies = [name for name in rows if name.startswith("strategy:")]
    assert rows["gpu-visible"] == "skip" and "CPU check mode" in summary
    assert {
        rows[name] for name in ("imports", "gpu-suite", "selftest", "seed-cnn", "checkpoint:async", "recorder")
    } == {"pass"}, summary
    assert [s.split(":")[1] for s in strategies] == ["ddp", "zero1", "fsdp", "fsdp-bf16", "deepspeed"]
    assert all(rows[s] == "pass" for s in strategies[:-1]) and rows["strategy:deepspeed"] == "skip", summary
    assert "deepspeed is not installed" in summary and rows["nccl-hang-notice"] in ("pass", "skip")
    assert "73.5 s" in summary and "1 passed, 0 failed, 0 skipped" in summary
    assert "result: PASS" in summary and done.stdout.endswith(summary)
    assert "torch:      " + torch.__version__ in summary

    suite = ET.parse(out / "junit.xml").getroot()
    assert int((suite if suite.tag == "testsuite" else suite.find("testsuite")).get("tests")) == 1
    assert json.loads((out / "selftest.json").read_text())["ok"] is True
    assert "== strategy:fsdp-bf16" in (out / "gpu-suite.log").read_text()  # every pytest step's output there
    setup = (out / "setup.log").read_text()
    assert f"{wheel.name}: on PYTHONPATH" in setup and f":{wheel}:" in setup.replace("\n", ":")


@NO_GPU
@pytest.mark.timeout(300)
def test_a_step_that_fails_fails_the_check(tmp_path):
    """One step chosen (TRAINSCALE_GPU_CHECK_STEPS), its tests all deselected: pytest's exit code 5 is a failure,
    the summary says which, and the check exits 1. Its wheels: the committed ones (scripts/wheels)."""
    done = subprocess.run(
        ["bash", str(SCRIPT), "out"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
        env=env(
            TRAINSCALE_GPU_SUITE_ON_CPU="1",
            TRAINSCALE_GPU_CHECK_STEPS="gpu-suite",
            TRAINSCALE_GPU_CHECK_PYTEST_ARGS="-k no_such_test",
            TMPDIR=str(tmp_path),
        ),
    )
    summary = (tmp_path / "out" / "summary.txt").read_text()
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-2000:]
    assert "result: FAIL (gpu-suite)" in summary and "exit code 5" in summary
    rows = summary.split("\nstep ", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    assert [row.split()[0] for row in rows] == ["gpu-visible", "imports", "gpu-suite"]
    assert "python_hostlist-2.3.0-py3-none-any.whl" in (tmp_path / "out" / "setup.log").read_text()


@NO_GPU
def test_without_a_gpu_it_stops_with_one_line_and_writes_nothing(tmp_path):
    done = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
        env=env(TMPDIR=str(tmp_path)),
    )
    said = (done.stdout + done.stderr).splitlines()
    assert done.returncode == 2
    assert len(said) == 1 and said[0].startswith("gpu-check: no GPU visible to "), said
    assert "TRAINSCALE_GPU_SUITE_ON_CPU=1" in said[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_an_outdir_with_files_is_refused_in_one_line(tmp_path):
    (tmp_path / "old.txt").write_text("")
    done = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env(TRAINSCALE_GPU_SUITE_ON_CPU="1"),
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"gpu-check: {tmp_path} exists and is not an empty directory: give a new one (the check writes 7 files there)"
    ]


@NO_GPU
@pytest.mark.parametrize("paths, fails", [(["tests/gpu"], True), (["tests/gpu", "tests/unit/test_help.py"], False)])
def test_the_gpu_suite_alone_fails_when_no_gpu_test_ran(paths, fails):
    """`make test-gpu` runs `pytest tests/gpu`: a green run with every test skipped would prove nothing. In a run of
    more than the GPU suite (`make test`) its tests stay plain skips."""
    command = [sys.executable, "-m", "pytest", *paths, "-p", "no:cacheprovider", "-q", "-k", CHEAP_GPU_TEST]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300, env=env())
    last = done.stdout.splitlines()[-1]
    if fails:
        assert done.returncode == 1, done.stdout[-3000:]
        assert last.startswith("GPU suite FAILED: no GPU visible (torch "), last
        assert "TRAINSCALE_GPU_SUITE_ON_CPU=1" in last
    else:
        assert done.returncode == 0, done.stdout[-3000:]
        assert "1 skipped" in last
