"""What DeepSpeed is told before it is imported: its accelerator and LOCAL_RANK as the GPU index.
Plain data in, variables out; DeepSpeed itself runs in tests/integration/test_strategies_deepspeed.py."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")


def _rank(device: str, local_rank: int):
    return SimpleNamespace(device=torch.device(device), local_rank=local_rank)


def test_one_gpu_per_task_gives_deepspeed_the_gpu_index_not_the_local_rank():
    """srun task with local rank 3 and one visible GPU: DeepSpeed would set_device(3), an invalid ordinal."""
    from trainscale.strategies.deepspeed import prepare_environment

    environ = {"LOCAL_RANK": "3", "TORCH_EXTENSIONS_DIR": "/x"}
    notes = prepare_environment(_rank("cuda:0", 3), environ)
    assert environ["LOCAL_RANK"] == "0"
    assert notes == ["LOCAL_RANK=0 for DeepSpeed, which takes it as the GPU index (cuda:0; local rank 3)"]
    assert "DS_ACCELERATOR" not in environ  # a GPU run leaves DeepSpeed's own accelerator choice alone


def test_a_single_plain_python_process_gets_the_local_rank_deepspeed_asserts():
    from trainscale.strategies.deepspeed import prepare_environment

    for device in ("cpu", "cuda:0"):
        environ = {"TORCH_EXTENSIONS_DIR": "/x"}
        prepare_environment(_rank(device, 0), environ)
        assert environ["LOCAL_RANK"] == "0"


def test_all_gpus_visible_keeps_the_local_rank_which_is_the_index():
    from trainscale.strategies.deepspeed import prepare_environment

    environ = {"LOCAL_RANK": "2", "TORCH_EXTENSIONS_DIR": "/x"}
    assert prepare_environment(_rank("cuda:2", 2), environ) == [] and environ["LOCAL_RANK"] == "2"


def test_mpi_local_rank_is_aligned_since_deepspeed_asserts_both_agree():
    from trainscale.strategies.deepspeed import prepare_environment

    environ = {"LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_RANK": "1", "TORCH_EXTENSIONS_DIR": "/x"}
    prepare_environment(_rank("cuda:0", 1), environ)
    assert environ["LOCAL_RANK"] == environ["OMPI_COMM_WORLD_LOCAL_RANK"] == "0"


def test_device_cpu_on_a_gpu_node_selects_deepspeeds_cpu_accelerator():
    from trainscale.strategies.deepspeed import prepare_environment

    environ = {"DS_ACCELERATOR": "cuda", "TORCH_EXTENSIONS_DIR": "/x", "LOCAL_RANK": "0"}
    notes = prepare_environment(_rank("cpu", 0), environ)
    assert environ["DS_ACCELERATOR"] == "cpu" and any("DS_ACCELERATOR=cpu" in n for n in notes)


def test_extensions_are_cached_under_trainscale_unless_set(monkeypatch, tmp_path):
    from trainscale.strategies.deepspeed import extensions_dir, prepare_environment

    monkeypatch.setenv("HOME", str(tmp_path))
    environ = {"LOCAL_RANK": "0", "DS_ACCELERATOR": "cpu"}
    prepare_environment(_rank("cpu", 0), environ)
    cache = Path(environ["TORCH_EXTENSIONS_DIR"])
    assert cache.parent == tmp_path / ".cache" / "trainscale" / "torch_extensions"
    # one directory per environment: another interpreter prefix (another venv or container) gets its own
    monkeypatch.setattr(sys, "prefix", "/opt/another-venv")
    assert Path(extensions_dir({})).parent == cache.parent and Path(extensions_dir({})) != cache
    assert extensions_dir({"TORCH_EXTENSIONS_DIR": "/x"}) == "/x"


def test_ops_are_built_with_this_environments_ninja(monkeypatch, tmp_path):
    """Two ninja versions keep incompatible logs in one build directory: a job whose PATH finds the system's
    ninja would rebuild the op a shell's venv ninja built, and back. The environment's own ninja goes first."""
    from trainscale.strategies.deepspeed import prepare_environment

    bin_dir = tmp_path / "venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "ninja").write_text("#!/bin/sh\n")
    (bin_dir / "ninja").chmod(0o755)
    other = tmp_path / "usr-bin"
    other.mkdir()
    (other / "ninja").write_text("#!/bin/sh\n")
    (other / "ninja").chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    environ = {"LOCAL_RANK": "0", "DS_ACCELERATOR": "cpu", "TORCH_EXTENSIONS_DIR": "/x", "PATH": str(other)}
    notes = prepare_environment(_rank("cpu", 0), environ)
    assert environ["PATH"].split(os.pathsep) == [str(bin_dir), str(other)]
    assert any(str(bin_dir) in n for n in notes)
    # already first: nothing changes, nothing said
    notes = prepare_environment(_rank("cpu", 0), environ)
    assert environ["PATH"].split(os.pathsep) == [str(bin_dir), str(other)] and not any("PATH" in n for n in notes)


def test_a_lock_left_by_a_stopped_build_is_refused_naming_the_file(tmp_path):
    """torch's builder waits for its lock file to disappear: one left by a build that was stopped (Ctrl-C,
    a killed job) would hold every rank forever without a word."""
    import time

    from trainscale.errors import ConfigError
    from trainscale.strategies.deepspeed import STALE_LOCK_S, check_build_locks

    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir()
    lock.touch()
    now = time.time()
    check_build_locks(tmp_path, now=now + 60)  # another rank building right now: wait for it, as torch does
    check_build_locks(tmp_path / "not-built-yet", now=now)
    with pytest.raises(ConfigError, match=r"holds a lock 20 min old, .*lock, left by a build that was stopped") as err:
        check_build_locks(tmp_path, now=now + 1200)
    assert err.value.hint == f"remove {lock} and start again" and 1200 > STALE_LOCK_S


def test_the_launcher_refuses_a_stale_build_lock_before_any_rank_starts(tmp_path):
    import os
    import subprocess

    cache = tmp_path / "extensions"
    lock = cache / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.touch()
    os.utime(lock, (1_000_000_000, 1_000_000_000))
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(cache), "TRAINSCALE_STATE_DIR": str(tmp_path / "state")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainscale",
            "run",
            "--nproc-per-node",
            "2",
            "--workload",
            "gpt",
            "--max-steps",
            "2",
            "--strategy",
            "deepspeed:stage=2",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "left by a build that was stopped" in done.stderr and f"remove {lock}" in done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "trainscale-runs").exists()  # nothing started


def test_the_first_start_says_it_compiles_the_cpu_op_and_a_cached_one_says_nothing(tmp_path):
    """DeepSpeed's first CPU start compiles its shared-memory op for about a minute without a word (issue 38
    item 6): trainscale names the build before it starts, and only when the op is not cached yet."""
    from trainscale.strategies.deepspeed import CPU_OP, op_to_build

    assert op_to_build(tmp_path, "cpu") == CPU_OP
    assert op_to_build(tmp_path, "cuda") is None
    (tmp_path / CPU_OP).mkdir()
    (tmp_path / CPU_OP / "build.ninja").write_text("")  # a build stopped half way: still to build
    assert op_to_build(tmp_path, "cpu") == CPU_OP
    (tmp_path / CPU_OP / f"{CPU_OP}.so").write_bytes(b"\x7fELF")
    assert op_to_build(tmp_path, "cpu") is None
