"""Batch scripts rendered from spec + profile: golden files per profile x launch mode, and their invariants.

Regenerate the golden files after an intended change with:
    TRAINSCALE_REGEN_GOLDEN=1 pytest tests/unit/test_slurm_render.py
and review the diff.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from trainscale.errors import ConfigError
from trainscale.launch.slurm import SlurmJobSpec, render, resolve
from trainscale.profiles.loader import builtin_profile_dir, profile_from_file
from trainscale.profiles.schema import ClusterProfile, ContainerSpec

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "slurm"
REGEN = os.environ.get("TRAINSCALE_REGEN_GOLDEN") == "1"
PY = "/opt/venv/bin/python"


def builtin(name: str) -> ClusterProfile:
    # Straight from the package's data files, so a user's own profile of the same name cannot change the result.
    return profile_from_file(builtin_profile_dir() / f"{name}.toml")


def cases() -> dict[str, dict]:
    return {
        "local-test": dict(workload="cnn", args=("--max-steps", "20", "--batch-size", "16"), nodes=2, gpus_per_node=2,
                           time="00:10:00"),
        "lumi": dict(script="/project/project_465000000/train.py", args=("--lr", "3e-4", "--name", "run one"),
                     nodes=4, time="1-00:00:00", account="project_465000000", container="/project/images/pytorch.sif",
                     signal="USR1@90", requeue=True, env={"NCCL_DEBUG": "INFO"}),
        "cyclone": dict(module="mypkg.train", args=("--config", "conf/base.toml"), nodes=2, time="04:00:00",
                        reservation="training-week", mem_per_gpu="40G"),
        "generic-nvidia": dict(script="/home/alice/train.py", nodes=8, gpus_per_node=8, time="12:00:00",
                               partition="a100", extra_sbatch=("--constraint=a100-80gb", "--exclusive")),
    }


def spec_for(profile: str, launcher: str) -> SlurmJobSpec:
    return SlurmJobSpec(profile=profile, launcher=launcher, python=PY, output_dir=Path("/scratch/jobs"),
                        command_line=("trainscale", "slurm", "--profile", profile, "--launcher", launcher, "..."),
                        **cases()[profile])


@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
@pytest.mark.parametrize("profile", ["local-test", "lumi", "cyclone", "generic-nvidia"])
def test_golden(profile, launcher):
    text = render(spec_for(profile, launcher), builtin(profile))
    path = GOLDEN / f"{profile}-{launcher}.sbatch"
    if REGEN:
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with TRAINSCALE_REGEN_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{path} differs; if intended, regenerate with TRAINSCALE_REGEN_GOLDEN=1"


@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
@pytest.mark.parametrize("profile", ["local-test", "lumi", "cyclone", "generic-nvidia"])
def test_script_is_valid_bash(profile, launcher):
    text = render(spec_for(profile, launcher), builtin(profile))
    done = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr


def sbatch_options(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        m = re.match(r"#SBATCH (--[\w-]+)(?:=(.*))?$", line)
        if m:
            assert m.group(1) not in out, f"{m.group(1)} given twice"
            out[m.group(1)] = m.group(2) or ""
    return out


def test_header_names_version_and_exact_command():
    from trainscale import __version__

    spec = SlurmJobSpec(script="/t/train.py", args=("--name", "a b"), profile="lumi", time="01:00:00",
                        command_line=("trainscale", "slurm", "/t/train.py", "--name", "a b"))
    text = render(spec, builtin("lumi"))
    assert text.startswith("#!/bin/bash\n")
    assert f"trainscale {__version__}" in text.splitlines()[1]
    assert "# Command: trainscale slurm /t/train.py --name 'a b'" in text


def test_torchrun_mode_one_task_per_node_with_all_its_cpus():
    spec = SlurmJobSpec(workload="cnn", profile="lumi", nodes=2, time="01:00:00", launcher="torchrun", python=PY)
    text = render(spec, builtin("lumi"))
    opts = sbatch_options(text)
    assert opts["--ntasks-per-node"] == "1" and opts["--cpus-per-task"] == "56" and opts["--gpus-per-node"] == "8"
    assert "--nproc-per-node 8" in text and '--rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT"' in text
    assert '--rdzv-id "$SLURM_JOB_ID"' in text and "--kill-on-bad-exit=1" in text
    assert "mask_cpu" not in text  # torchrun cannot bind: the workers do, from TRAINSCALE_CPU_BIND
    assert "export TRAINSCALE_CPU_BIND=0:49-55/1:57-63/2:17-23/3:25-31/4:1-7/5:9-15/6:33-39/7:41-47" in text
    assert "export OMP_NUM_THREADS=7" in text


def test_srun_mode_one_task_per_gpu_with_lumi_masks():
    spec = SlurmJobSpec(workload="cnn", profile="lumi", nodes=2, time="01:00:00", launcher="srun", python=PY)
    text = render(spec, builtin("lumi"))
    opts = sbatch_options(text)
    assert opts["--ntasks-per-node"] == "8" and opts["--cpus-per-task"] == "7"
    masks = ("0xfe000000000000,0xfe00000000000000,0xfe0000,0xfe000000,0xfe,0xfe00,0xfe00000000,0xfe0000000000")
    assert f"--cpu-bind=mask_cpu:{masks}" in text
    assert "-m trainscale.launch.bootstrap" in text and "--module trainscale.workloads cnn" in text


def test_job_dir_made_before_srun_and_output_outside_it():
    spec = SlurmJobSpec(script="/t/x.py", profile="local-test", time="5", output_dir=Path("/o"), job_name="exp",
                        launcher="srun")
    text = render(spec, builtin("local-test"))
    assert sbatch_options(text)["--output"] == "/o/exp-%j.out"  # slurmd opens it before the script runs
    assert text.index('mkdir -p "$JOB_DIR/errors"') < text.index("\nsrun ")
    assert "JOB_DIR=/o/exp-${SLURM_JOB_ID}" in text and '--output="$JOB_DIR/rank-%t.out"' in text


def test_master_port_checked_on_first_node():
    spec = SlurmJobSpec(script="/t/x.py", profile="local-test", time="5", python=PY, master_port=29500)
    text = render(spec, builtin("local-test"))
    assert 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)' in text
    assert f'MASTER_PORT=$({PY} -m trainscale.launch.slurm.port --host "$MASTER_ADDR" --port 29500)' in text
    assert text.index("MASTER_PORT=$(") < text.index("\nsrun ")


def test_container_wrapper_and_profile_environment():
    spec = SlurmJobSpec(script="/t/x.py", profile="lumi", time="5", account="p", container="/img/pt.sif")
    text = render(spec, builtin("lumi"))
    assert "singularity exec -B /pfs,/scratch," in text and " /img/pt.sif" in text
    assert "python3 -m trainscale.launch.bootstrap" in text or "python3 -m trainscale run" in text
    # profile values keep ${...} expandable and the order of the profile file
    assert 'export MIOPEN_USER_DB_PATH="/tmp/${USER}-miopen-cache-${SLURM_JOB_ID}"' in text
    assert text.index("MIOPEN_USER_DB_PATH=") < text.index("MIOPEN_CUSTOM_CACHE_DIR=")
    assert "module load LUMI/24.03 partition/G" in text


def test_container_without_profile_section_uses_vendor_flag():
    profile = ClusterProfile(name="x", gpus_per_node=4, gpu_vendor="nvidia", cpus_per_node=32)
    spec = SlurmJobSpec(script="/t/x.py", profile="x", time="5", container="img.sif")
    assert "singularity exec --nv img.sif" in render(spec, profile)
    profile = ClusterProfile(name="y", gpus_per_node=4, gpu_vendor="amd", cpus_per_node=32,
                             container=ContainerSpec(runtime="apptainer", binds=("/data",), flags=("--rocm",)))
    assert "apptainer exec -B /data --rocm img.sif" in render(SlurmJobSpec(script="/t/x.py", profile="y", time="5",
                                                                          container="img.sif"), profile)


def test_user_env_is_quoted_but_cannot_run_commands():
    spec = SlurmJobSpec(script="/t/x.py", profile="local-test", time="5", env={"A": "x $(touch /tmp/pwned) `id`"})
    text = render(spec, builtin("local-test"))
    assert 'export A="x \\$(touch /tmp/pwned) \\`id\\`"' in text


def test_signal_and_requeue():
    spec = SlurmJobSpec(script="/t/x.py", profile="local-test", time="5", signal="USR1@90", requeue=True)
    opts = sbatch_options(render(spec, builtin("local-test")))
    assert opts["--signal"] == "USR1@90" and "--requeue" in opts


def test_plan_numbers_for_cpu_profile():
    plan = resolve(SlurmJobSpec(workload="cnn", profile="local-test", nodes=2, gpus_per_node=2, time="5",
                                launcher="srun"), builtin("local-test"))
    assert (plan.world_size, plan.tasks_per_node, plan.cpus_per_task, plan.cpus_per_rank, plan.gpus_per_node) == \
        (4, 2, 2, 2, 0)


@pytest.mark.parametrize("bad, fragment", [
    (dict(), "nothing to run"),
    (dict(script="a.py", workload="cnn"), "exactly one"),
    (dict(script="a.py", time="soon"), "not a SLURM time"),
    (dict(script="a.py", nodes=0), "--nodes 0"),
    (dict(script="a.py", launcher="mpirun"), "--launcher 'mpirun'"),
    (dict(script="a.py", mem_per_gpu="lots"), "not a SLURM size"),
    (dict(script="a.py", signal="USR1@soon"), "--signal"),
    (dict(script="a.py", job_name="a/b"), "--job-name"),
    (dict(script="a.py", extra_sbatch=("constraint=a100",)), "is not an option"),
])
def test_spec_validation(bad, fragment):
    kwargs = dict(time="01:00:00") | bad
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        SlurmJobSpec(**kwargs)


@pytest.mark.parametrize("text, seconds", [("30", 1800), ("01:30:00", 5400), ("2-00:00:00", 172800),
                                           ("1-12", 129600), ("10:30", 630)])
def test_parse_time(text, seconds):
    from trainscale.launch.slurm.spec import format_time, parse_time

    assert parse_time(text) == seconds
    assert parse_time(format_time(seconds)) == seconds
