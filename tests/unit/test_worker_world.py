"""Every worker gets one consistent world (launch/bootstrap.py), and the job kit runs without trainscale.

A torchrun-style script reads RANK/LOCAL_RANK, a SLURM-style one (seed 004) SLURM_PROCID/SLURM_LOCALID/
NODE_RANK: both must see the same, distinct rank in either launch mode.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainscale.launch.bootstrap import export_world_env, task_gpu

SRUN_TASK = {
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_JOB_ID": "42",
    "MASTER_ADDR": "n1",
    "MASTER_PORT": "29511",
}

# A worker that torchrun's agent started inside the agent's srun task (torchrun mode, node 2 of 2):
# SLURM's variables still describe the agent's task (task 1 of 2, one per node).
TORCHRUN_WORKER = {
    "TORCHELASTIC_RUN_ID": "42",
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "4",
    "LOCAL_WORLD_SIZE": "2",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "n1",
    "MASTER_PORT": "29511",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_TASKS_PER_NODE": "1(x2)",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_ID": "0",
    "SLURM_JOB_ID": "42",
    "SLURM_NNODES": "2",
}

TORCHRUN_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")


def test_srun_task_gets_torchruns_variables_and_node_rank():
    env = dict(SRUN_TASK)
    export_world_env(env)
    assert {k: env[k] for k in TORCHRUN_NAMES} == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "NODE_RANK": "1",
        "MASTER_ADDR": "n1",
        "MASTER_PORT": "29511",
    }
    assert env["SLURM_TASKS_PER_NODE"] == "2(x2)"  # an srun task's own SLURM variables are already right


def test_torchrun_worker_gets_slurm_variables_that_agree_with_its_rank():
    env = dict(TORCHRUN_WORKER)
    export_world_env(env)
    assert (env["SLURM_PROCID"], env["SLURM_LOCALID"], env["SLURM_NODEID"]) == ("3", "1", "1")
    assert env["SLURM_NTASKS"] == env["SLURM_STEP_NUM_TASKS"] == env["SLURM_NPROCS"] == "4"
    assert env["SLURM_NTASKS_PER_NODE"] == "2" and env["SLURM_TASKS_PER_NODE"] == "2(x2)"
    assert env["NODE_RANK"] == "1" and env["SLURM_NNODES"] == "2"
    # The seed-004 arithmetic a SLURM-style script does holds again: rank = node * per-node + local.
    assert int(env["SLURM_PROCID"]) == int(env["SLURM_NODEID"]) * int(env["SLURM_NTASKS_PER_NODE"]) + int(
        env["SLURM_LOCALID"]
    )


def test_plain_process_gets_nothing():
    env = {"PATH": "/bin"}
    export_world_env(env)
    assert env == {"PATH": "/bin"}


@pytest.mark.parametrize(
    "environ, expected",
    [
        ({"TRAINSCALE_TASK_GPU": "ROCR_VISIBLE_DEVICES", "SLURM_LOCALID": "3"}, ("ROCR_VISIBLE_DEVICES", "3")),
        (
            {"TRAINSCALE_TASK_GPU": "CUDA_VISIBLE_DEVICES", "SLURM_LOCALID": "1", "CUDA_VISIBLE_DEVICES": "4,5,6,7"},
            ("CUDA_VISIBLE_DEVICES", "5"),
        ),  # the local rank's entry of what SLURM made visible, not GPU 1
        ({"TRAINSCALE_TASK_GPU": "CUDA_VISIBLE_DEVICES", "SLURM_LOCALID": "2", "CUDA_VISIBLE_DEVICES": "0,1"}, None),
        ({"SLURM_LOCALID": "1"}, None),
    ],
)
def test_each_srun_task_sees_its_own_gpu(environ, expected):
    assert task_gpu(environ) == expected


def _run_kit(python: str, kit: Path, script: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, "-I", str(kit / "boot.py"), "--script", str(script), "x"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_kit_runs_with_a_bare_python_that_has_no_trainscale(tmp_path):
    """The kit is what a stock container runs: the system Python (no torch, no trainscale, no hostlist)."""
    from trainscale.launch.kit import kit_name, write_kit

    bare = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else shutil.which("python3")
    probe = subprocess.run([bare, "-I", "-c", "import trainscale"], capture_output=True)
    if probe.returncode == 0:
        pytest.skip(f"{bare} can import trainscale: not a bare interpreter")
    kit = write_kit(tmp_path / "jobs")
    assert kit.name == kit_name() and write_kit(tmp_path / "jobs") == kit  # written once, named by content
    script = tmp_path / "seed004_style.py"
    script.write_text(
        "import json, os, sys\n"
        "names = ['RANK', 'LOCAL_RANK', 'WORLD_SIZE', 'NODE_RANK', 'SLURM_PROCID', 'SLURM_LOCALID', "
        "'ROCR_VISIBLE_DEVICES', 'TRAINSCALE_KIT']\n"
        "print(json.dumps({n: os.environ.get(n) for n in names}))\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.startswith('trainscale'))))\n"
        "print(json.dumps(sys.argv))\n"
        "import trainscale\n"
    )  # the image has none: the kit's copy must not answer
    env = {
        "PATH": "/usr/bin:/bin",
        **SRUN_TASK,
        "TRAINSCALE_TASK_GPU": "ROCR_VISIBLE_DEVICES",
        "TRAINSCALE_ERROR_DIR": str(tmp_path),
    }
    done = _run_kit(bare, kit, script, env)
    assert done.returncode == 1, done.stderr
    seen, modules, argv = (json.loads(line) for line in done.stdout.splitlines()[:3])
    assert seen == {
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": "4",
        "NODE_RANK": "1",
        "SLURM_PROCID": "3",
        "SLURM_LOCALID": "1",
        "ROCR_VISIBLE_DEVICES": "1",
        "TRAINSCALE_KIT": None,
    }
    assert modules == [] and argv == [str(script), "x"]
    assert "No module named 'trainscale'" in done.stderr
    error = json.loads((tmp_path / "error-rank3.json").read_text())  # @record's file, without torch
    assert "ModuleNotFoundError" in error["message"]["message"]
    port = subprocess.run([bare, "-I", str(kit / "port.py"), "--host", "127.0.0.1"], capture_output=True, text=True)
    assert port.returncode == 0 and 0 < int(port.stdout) < 65536
    missing = subprocess.run(
        [bare, "-I", str(kit / "port.py"), "--host", "127.0.0.1", "--require", "torch"], capture_output=True, text=True
    )
    assert missing.returncode == 3 and "cannot import torch" in missing.stderr and missing.stdout == ""


def test_kit_leaves_the_images_own_trainscale_to_the_script(tmp_path):
    """With trainscale installed in the image (a venv passed with --python), the script gets that one."""
    from trainscale.launch.kit import write_kit

    kit = write_kit(tmp_path / "jobs")
    script = tmp_path / "uses_trainscale.py"
    script.write_text("import trainscale, sys\nprint(trainscale.__file__)\n")
    env = {**os.environ, **SRUN_TASK}
    done = _run_kit(sys.executable, kit, script, env)
    assert done.returncode == 0, done.stderr
    import trainscale

    assert Path(done.stdout.strip()).resolve() == Path(trainscale.__file__).resolve()  # not the kit's copy


def test_the_kit_holds_every_module_the_recorder_and_heartbeat_load():
    """A stock image has no trainscale: what the bootstrap loads once the script imports torch, and what those
    modules import later, must all be in the kit (tests/slurm/test_containers.py records a job's steps there)."""
    import ast

    from trainscale.launch.kit import MODULES, PACKAGE
    from trainscale.observe.worker import OBSERVERS

    kit = {m.removesuffix(".py").replace("/", ".").removesuffix(".__init__") for m in MODULES}
    assert {name.removeprefix("trainscale.") for name in OBSERVERS} <= kit
    for name in OBSERVERS:  # and every trainscale module they import, lazily or not
        tree = ast.parse((PACKAGE / (name.removeprefix("trainscale.").replace(".", "/") + ".py")).read_text())
        imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
        for module in imported:
            if module.startswith("trainscale."):
                assert module.removeprefix("trainscale.") in kit or module in OBSERVERS, (name, module)
