"""Batch scripts rendered from spec + profile: golden files per profile x launch mode, and their invariants.

Regenerate the golden files after an intended change with:
    TRAINSCALE_REGEN_GOLDEN=1 pytest tests/unit/test_slurm_render.py
and review the diff.
"""

from __future__ import annotations

import dataclasses
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
        "local-test": dict(
            workload="cnn", args=("--max-steps", "20", "--batch-size", "16"), nodes=2, gpus_per_node=2, time="00:10:00"
        ),
        "lumi": dict(
            script="/project/project_465000000/train.py",
            args=("--lr", "3e-4", "--name", "run one"),
            nodes=4,
            time="1-00:00:00",
            account="project_465000000",
            container="/project/images/pytorch.sif",
            signal="USR1@90",
            requeue=True,
            env={"NCCL_DEBUG": "INFO"},
        ),
        "cyclone": dict(
            module="mypkg.train",
            args=("--config", "conf/base.toml"),
            nodes=2,
            time="04:00:00",
            reservation="training-week",
            mem_per_gpu="40G",
        ),
        "generic-nvidia": dict(
            script="/home/alice/train.py",
            nodes=8,
            gpus_per_node=8,
            time="12:00:00",
            partition="a100",
            constraint="a100-80gb",
            exclusive=True,
        ),
    }


# Stock site images (Python and torch, no trainscale), as a LUMI / Cyclone / NVIDIA-pyxis user runs them.
STOCK = {
    "lumi": dict(
        script="/project/project_465000000/cnn_multinode.py",
        args=("--epochs", "5"),
        nodes=2,
        time="00:30:00",
        account="project_465000000",
        partition="standard-g",
        container="/appl/local/containers/sif-images/lumi-pytorch-rocm-6.2.4-python-3.12-pytorch-v2.7.1.sif",
        container_setup=("$WITH_CONDA",),  # the profile's [container] modules load singularity-AI-bindings
        binds=("/scratch/project_465000000/env.sqsh:/user-software:image-src=/",),
    ),
    "cyclone": dict(
        script="/nvme/h/alice/tutorial_04/cnn_multinode.py",
        args=("--batch_size", "16"),
        nodes=2,
        gpus_per_node=2,
        time="01:00:00",
        container="/nvme/h/alice/images/pytorch-24.05.sif",
        modules=("load Apptainer",),
    ),
    "generic-nvidia-pyxis": dict(
        script="/home/alice/train.py",
        nodes=2,
        time="02:00:00",
        container="nvcr.io#nvidia/pytorch:24.05-py3",
        binds=("/data:/data:ro",),
    ),
}
KIT = Path("/scratch/jobs/.trainscale/kit-0123456789ab")


def spec_for(profile: str, launcher: str) -> SlurmJobSpec:
    return SlurmJobSpec(
        profile=profile,
        launcher=launcher,
        python=PY,
        output_dir=Path("/scratch/jobs"),
        run_name="exp-20261123-140000",
        command_line=("trainscale", "slurm", "--profile", profile, "--launcher", launcher, "..."),
        **cases()[profile],
    )


def stock_spec_for(profile: str, launcher: str) -> SlurmJobSpec:
    return SlurmJobSpec(
        profile=profile,
        launcher=launcher,
        output_dir=Path("/scratch/jobs"),
        run_name="exp-20261123-140000",
        command_line=("trainscale", "slurm", "--profile", profile, "--container", "...", "..."),
        **STOCK[profile],
    )


def check_golden(text: str, name: str) -> None:
    path = GOLDEN / name
    if REGEN:
        path.write_text(text)
    assert path.exists(), f"no golden file {path}; run with TRAINSCALE_REGEN_GOLDEN=1 to create it"
    assert text == path.read_text(), f"{path} differs; if intended, regenerate with TRAINSCALE_REGEN_GOLDEN=1"


@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
@pytest.mark.parametrize("profile", ["lumi", "cyclone", "generic-nvidia-pyxis"])
def test_golden_stock_image(profile, launcher):
    text = render(stock_spec_for(profile, launcher), builtin(profile), kit_dir=KIT)
    check_golden(text, f"{profile}-stock-{launcher}.sbatch")
    done = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr


# Site module lines and the Python they bring: LUMI's stack outside a container, a job's own lines instead of the
# profile's, and the course's Cyclone line (a PyTorch module, whose python3 the job runs, with the job kit), whose
# script arguments name job-time variables.
SITE = {
    "lumi-modules-torchrun": (
        "lumi",
        dict(
            script="/project/project_465000000/train.py",
            nodes=2,
            time="02:00:00",
            account="project_465000000",
            launcher="torchrun",
            modules=("load my-pytorch/2.4",),
        ),
    ),
    "lumi-own-modules-srun": (
        "lumi",
        dict(
            script="/project/project_465000000/train.py",
            nodes=2,
            time="02:00:00",
            account="project_465000000",
            launcher="srun",
            profile_modules=False,
            modules=("load LUMI/24.03 partition/G", "load my-pytorch/2.4"),
        ),
    ),
    "cyclone-module-srun": (
        "cyclone",
        dict(
            script="/nvme/h/alice/tutorial_04/cnn_multinode.py",
            nodes=2,
            gpus_per_node=2,
            time="02:00:00",
            launcher="srun",
            modules=("load PyTorch/1.12.0-foss-2022a-CUDA-11.7.0",),
            args=("--output-path", "$OUTPUT_DIR/run-${SLURM_JOB_ID}", "--note", "cost \\$5 * $(date)"),
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(SITE))
def test_golden_site_modules(name):
    profile, fields = SITE[name]
    spec = SlurmJobSpec(
        profile=profile,
        output_dir=Path("/scratch/jobs"),
        run_name="exp-20261123-140000",
        command_line=("trainscale", "slurm", "--profile", profile, "..."),
        **fields,
    )
    text = render(spec, builtin(profile), kit_dir=KIT)
    check_golden(text, f"{name}.sbatch")
    done = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
@pytest.mark.parametrize("profile", ["local-test", "lumi", "cyclone", "generic-nvidia"])
def test_golden(profile, launcher):
    check_golden(render(spec_for(profile, launcher), builtin(profile), kit_dir=KIT), f"{profile}-{launcher}.sbatch")


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

    spec = SlurmJobSpec(
        script="/t/train.py",
        args=("--name", "a b"),
        profile="lumi",
        time="01:00:00",
        command_line=("trainscale", "slurm", "/t/train.py", "--name", "a b"),
    )
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
    assert _threads_on_a_node(text, node_cpus=128) == 7  # CPUs per rank: 56 / 8


@pytest.mark.parametrize("node_cpus, threads", [(128, 7), (56, 7), (16, 2), (4, 1)])
def test_threads_per_rank_never_outnumber_the_cpus_the_node_gives(node_cpus, threads):
    """A node that lets the job use fewer CPUs than the profile says (a smaller allocation, a node
    definition that overstates its cores) gets fewer OpenMP threads, not spin-waiting ones."""
    spec = SlurmJobSpec(workload="cnn", profile="lumi", nodes=1, time="01:00:00", launcher="srun", python=PY)
    assert _threads_on_a_node(render(spec, builtin("lumi")), node_cpus) == threads


def _threads_on_a_node(text: str, node_cpus: int) -> int:
    """Run the script's thread lines in bash on a node whose ``nproc`` says ``node_cpus``."""
    lines = [line for line in text.splitlines() if line.startswith(("OMP_NUM_THREADS=", "export OMP_NUM_THREADS="))]
    assert len(lines) == 2, lines
    done = subprocess.run(
        ["bash", "-c", f"nproc() {{ echo {node_cpus}; }}\n" + "\n".join(lines) + '\necho "$OMP_NUM_THREADS"'],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout)


def test_srun_mode_one_task_per_gpu_with_lumi_masks():
    spec = SlurmJobSpec(workload="cnn", profile="lumi", nodes=2, time="01:00:00", launcher="srun", python=PY)
    text = render(spec, builtin("lumi"))
    opts = sbatch_options(text)
    assert opts["--ntasks-per-node"] == "8" and opts["--cpus-per-task"] == "7"
    masks = "0xfe000000000000,0xfe00000000000000,0xfe0000,0xfe000000,0xfe,0xfe00,0xfe00000000,0xfe0000000000"
    assert f"--cpu-bind=mask_cpu:{masks}" in text
    assert "-m trainscale.launch.bootstrap" in text and "--module trainscale.workloads cnn" in text


def test_job_dir_made_before_srun_and_output_outside_it():
    spec = SlurmJobSpec(
        script="/t/x.py",
        profile="local-test",
        time="5",
        output_dir=Path("/o"),
        job_name="exp",
        launcher="srun",
        run_name="exp-1",
    )
    text = render(spec, builtin("local-test"))
    assert sbatch_options(text)["--output"] == "/o/exp-1/%j.out"  # in the run directory, made at submission
    assert text.index('mkdir -p "$JOB_DIR/errors"') < text.index("\nsrun ")
    assert "RUN_DIR=/o/exp-1" in text and 'JOB_DIR="$RUN_DIR/${SLURM_JOB_ID}"' in text
    assert '--output="$JOB_DIR/rank-%t.out"' in text
    assert "--script /o/exp-1/src/t/x.py" in text  # the run's snapshot of the script's directory, made at submission
    assert "export TRAINSCALE_SNAPSHOT=/o/exp-1/src/t TRAINSCALE_SNAPSHOT_OF=/t " in text  # imports map to the copy
    assert "PYTHONPATH" not in text  # the job imports as `trainscale run` does: nothing added


def test_master_port_checked_on_first_node():
    spec = SlurmJobSpec(script="/t/x.py", profile="local-test", time="5", python=PY, master_port=29500)
    text = render(spec, builtin("local-test"))
    assert 'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)' in text
    assert f'MASTER_PORT=$({PY} -m trainscale.launch.ports --host "$MASTER_ADDR" --port 29500)' in text
    assert text.index("MASTER_PORT=$(") < text.index("\nsrun ")


def test_container_wrapper_and_profile_environment():
    spec = SlurmJobSpec(
        script="/t/x.py",
        profile="lumi",
        time="5",
        account="p",
        container="/img/pt.sif",
        output_dir=Path("/scratch/p/jobs"),
    )
    text = render(spec, builtin("lumi"), kit_dir=KIT)
    assert "singularity exec -B /pfs,/scratch," in text and " /img/pt.sif" in text
    assert (
        ",/t " in text
    )  # the code's root is bound; /scratch/p/jobs (the kit, the logs, the snapshot) is under /scratch
    # a stock image: the image's own torchrun, each worker through the kit's bootstrap
    assert "python3 -m torch.distributed.run" in text and re.search(r'"\$KIT/boot.py" --script \S+/src/t/x.py', text)
    assert "-m trainscale" not in text.split("\nsrun ")[1]
    # profile values keep ${...} expandable and the order of the profile file
    assert 'export MIOPEN_USER_DB_PATH="/tmp/${USER}-miopen-cache-${SLURM_JOB_ID}"' in text
    assert text.index("MIOPEN_USER_DB_PATH=") < text.index("MIOPEN_CUSTOM_CACHE_DIR=")
    assert "module load singularity-AI-bindings" in text and "LUMI/25.03" not in text  # the image needs no stack


def test_container_without_profile_section_uses_vendor_flag():
    profile = ClusterProfile(name="x", gpus_per_node=4, gpu_vendor="nvidia", cpus_per_node=32)
    spec = SlurmJobSpec(script="/t/x.py", profile="x", time="5", container="img.sif", output_dir=Path("/o"))
    assert "singularity exec -B /o,/t --nv img.sif" in render(spec, profile, kit_dir=KIT)
    profile = ClusterProfile(
        name="y",
        gpus_per_node=4,
        gpu_vendor="amd",
        cpus_per_node=32,
        container=ContainerSpec(runtime="/opt/apptainer/bin/apptainer", binds=("/data",), flags=("--rocm",)),
    )
    text = render(
        SlurmJobSpec(script="/t/x.py", profile="y", time="5", container="img.sif", output_dir=Path("/o")),
        profile,
        kit_dir=KIT,
    )
    assert "/opt/apptainer/bin/apptainer exec -B /data,/o,/t --rocm img.sif" in text


def test_container_forms_run_setup_and_binds():
    base = dict(
        script="/t/x.py",
        profile="lumi",
        time="5",
        account="p",
        container="/img/pt.sif",
        output_dir=Path("/scratch/jobs"),
    )
    run = render(SlurmJobSpec(**base, container_mode="run"), builtin("lumi"), kit_dir=KIT)
    assert "singularity run -B " in run and "singularity exec" not in run
    setup = render(
        SlurmJobSpec(
            **base,
            container_setup=("$WITH_CONDA", "source /user-software/venv/bin/activate"),
            binds=("/scratch/p/env.sqsh:/user-software:image-src=/",),
        ),
        builtin("lumi"),
        kit_dir=KIT,
    )
    assert "bash -c '$WITH_CONDA; source /user-software/venv/bin/activate; exec \"$@\"' bash" in setup
    assert ",/scratch/p/env.sqsh:/user-software:image-src=/,/t /img/pt.sif" in setup
    # the check at job start runs in the same container, with the same set-up, and names image and fix
    port = next(line for line in setup.splitlines() if "MASTER_PORT=$(" in line)
    assert "bash -c '$WITH_CONDA;" in port and '"$KIT/port.py"' in port and "--require torch" in port
    assert "the image /img/pt.sif cannot run this job" in setup and "--container-setup" in setup


def test_pyxis_puts_the_image_on_srun():
    profile = builtin("generic-nvidia-pyxis")
    assert profile.extends == "generic-nvidia" and profile.gpus_per_node == 8 and profile.container.kind == "pyxis"
    spec = SlurmJobSpec(
        script="/home/a/train.py",
        profile="generic-nvidia-pyxis",
        time="5",
        launcher="srun",
        container="nvcr.io#nvidia/pytorch:24.05-py3",
        binds=("/data:/data:ro",),
        output_dir=Path("/o"),
    )
    text = render(spec, profile, kit_dir=KIT)
    srun = text.split("\nsrun ")[1]
    assert "--container-image='nvcr.io#nvidia/pytorch:24.05-py3'" in srun
    assert "--container-mounts=/data:/data:ro,/o:/o,/home/a:/home/a" in srun
    # the job's GPUs per node, each task narrowed to its own by the bootstrap: never a cgroup per GPU, which would
    # cut NCCL's P2P/CUDA IPC between the node's ranks (issue 22 item 6)
    assert "--gpus-per-task" not in text and "export TRAINSCALE_TASK_GPU=CUDA_VISIBLE_DEVICES" in text
    assert 'srun --nodes=1 --ntasks=1 -w "$MASTER_ADDR" --container-image=' in text  # the port check, in the image


def test_modules_tolerate_lmod_and_a_missing_module_system_is_an_error():
    spec = SlurmJobSpec(
        script="/t/x.py",
        profile="lumi",
        time="5",
        account="p",
        modules=("use /appl/local/containers/ai-modules", "module load singularity-AI-bindings"),
    )
    text = render(spec, builtin("lumi"))
    block = text[text.index("# Modules") : text.index("# Environment")]
    assert (
        block.index("set +u")
        < block.index("module purge")
        < block.index("module use /appl/local/containers/ai-modules")
    )
    assert block.index("module load singularity-AI-bindings") < block.rindex("set -u")
    assert "there is no \\`module\\` command" in block and "exit 1" in block
    assert "# Modules" not in render(
        SlurmJobSpec(script="/t/x.py", profile="local-test", time="5"), builtin("local-test")
    )


def test_setup_lines_run_before_launch():
    spec = SlurmJobSpec(script="/t/x.py", profile="local-test", time="5", setup=("source /p/venv/bin/activate",))
    text = render(spec, builtin("local-test"))
    assert text.index("# Setup (--setup)") < text.index("source /p/venv/bin/activate") < text.index("\nsrun ")


def test_sbatch_spellings_are_rendered_as_sbatch_writes_them():
    spec = SlurmJobSpec(
        script="/t/x.py",
        profile="generic-nvidia",
        time="UNLIMITED",
        gpus_per_node=4,
        gpu_type="a100",
        qos="high",
        constraint="a100-80gb",
        exclusive=True,
        dependency="afterok:123",
        array="0-7%2",
        mail_type="END,FAIL",
        mail_user="a@b.c",
        export="ALL",
        chdir="/work/a",
        output="/o/%x-%j.log",
        error="/o/%x-%j.err",
        requeue=False,
        output_dir=Path("/o"),
    )
    opts = sbatch_options(render(spec, builtin("generic-nvidia")))
    assert opts["--gpus-per-node"] == "a100:4" and opts["--time"] == "UNLIMITED" and opts["--qos"] == "high"
    assert opts["--constraint"] == "a100-80gb" and "--exclusive" in opts and opts["--dependency"] == "afterok:123"
    assert opts["--array"] == "0-7%2" and opts["--mail-type"] == "END,FAIL" and opts["--mail-user"] == "a@b.c"
    assert opts["--export"] == "ALL" and opts["--chdir"] == "/work/a" and "--no-requeue" in opts
    assert opts["--output"] == "/o/%x-%j.log" and opts["--error"] == "/o/%x-%j.err"


def test_site_requeue_default_is_kept():
    opts = sbatch_options(render(SlurmJobSpec(script="/t/x.py", profile="local-test", time="5"), builtin("local-test")))
    assert "--requeue" not in opts and "--no-requeue" not in opts


def test_partial_lumi_node_gets_no_fixed_masks_and_binds_on_the_node():
    spec = SlurmJobSpec(
        workload="cnn", profile="lumi", time="5", account="p", partition="small-g", gpus_per_node=4, launcher="srun"
    )
    plan = resolve(spec, builtin("lumi"))
    assert plan.partial_node and plan.cpus_per_rank == 7 and plan.cpus_per_task == 7
    text = render(spec, builtin("lumi"), plan)
    assert "mask_cpu" not in text and "--cpu-bind=none" in text
    assert "export TRAINSCALE_CPU_BIND=topology:0,8,16,24,32,40,48,56" in text
    exclusive = resolve(
        SlurmJobSpec(workload="cnn", profile="lumi", time="5", gpus_per_node=4, exclusive=True, launcher="srun"),
        builtin("lumi"),
    )
    assert not exclusive.partial_node and exclusive.rank_cpus


def test_cpus_follow_the_gpus_asked_for():
    plan = resolve(
        SlurmJobSpec(script="/t/x.py", profile="cyclone", time="5", gpus_per_node=2, launcher="torchrun"),
        builtin("cyclone"),
    )
    assert (plan.cpus_per_rank, plan.cpus_per_task) == (10, 20)  # 2 of 4 GPUs: 2 x (40 cores / 4 GPUs)
    cpu = resolve(
        SlurmJobSpec(script="/t/x.py", profile="local-test", time="5", gpus_per_node=2), builtin("local-test")
    )
    assert cpu.cpus_per_rank == 2  # CPU-only ranks share the node


def test_one_gpu_per_task_unless_the_script_picks_its_gpu_by_rank(tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text("import torch\nmodel = model.to(torch.device('cuda'))\n")
    by_rank = tmp_path / "seed004.py"
    by_rank.write_text(
        "import os, torch\nlocal_rank = int(os.environ['SLURM_LOCALID'])\n"
        "torch.cuda.set_device(local_rank)\ndevice = torch.device(f'cuda:{local_rank}')\n"
    )
    kw = dict(profile="cyclone", time="5", launcher="srun", nodes=2)
    text = render(SlurmJobSpec(script=str(plain), **kw), builtin("cyclone"))
    assert "export TRAINSCALE_TASK_GPU=CUDA_VISIBLE_DEVICES" in text
    plan = resolve(SlurmJobSpec(script=str(by_rank), **kw), builtin("cyclone"))
    assert not plan.task_gpu and "line 3 picks its GPU by rank index" in plan.gpu_visibility_reason
    assert "TRAINSCALE_TASK_GPU" not in render(SlurmJobSpec(script=str(by_rank), **kw), builtin("cyclone"))
    forced = resolve(SlurmJobSpec(script=str(by_rank), gpu_visibility="task", **kw), builtin("cyclone"))
    assert forced.task_gpu == "CUDA_VISIBLE_DEVICES"
    assert not resolve(SlurmJobSpec(script=str(plain), gpu_visibility="node", **kw), builtin("cyclone")).task_gpu
    amd = resolve(SlurmJobSpec(workload="cnn", profile="lumi", time="5", launcher="srun"), builtin("lumi"))
    assert amd.task_gpu == "ROCR_VISIBLE_DEVICES"
    torchrun = resolve(
        SlurmJobSpec(script=str(plain), profile="cyclone", time="5", launcher="torchrun"), builtin("cyclone")
    )
    assert not torchrun.task_gpu  # torchrun's workers see the node's GPUs and choose by LOCAL_RANK


def test_user_env_is_quoted_but_cannot_run_commands():
    spec = SlurmJobSpec(script="/t/x.py", profile="local-test", time="5", env={"A": "x $(touch /tmp/pwned) `id`"})
    text = render(spec, builtin("local-test"))
    assert 'export A="x \\$(touch /tmp/pwned) \\`id\\`"' in text


def test_signal_and_requeue():
    spec = SlurmJobSpec(script="/t/x.py", profile="local-test", time="5", signal="USR1@90", requeue=True)
    opts = sbatch_options(render(spec, builtin("local-test")))
    assert opts["--signal"] == "USR1@90" and "--requeue" in opts


def test_plan_numbers_for_cpu_profile():
    plan = resolve(
        SlurmJobSpec(workload="cnn", profile="local-test", nodes=2, gpus_per_node=2, time="5", launcher="srun"),
        builtin("local-test"),
    )
    assert (plan.world_size, plan.tasks_per_node, plan.cpus_per_task, plan.cpus_per_rank, plan.gpus_per_node) == (
        4,
        2,
        2,
        2,
        0,
    )


@pytest.mark.parametrize(
    "bad, fragment",
    [
        (dict(), "nothing to run"),
        (dict(script="a.py", workload="cnn"), "exactly one"),
        (dict(script="a.py", time="soon"), "not a SLURM time"),
        (dict(script="a.py", nodes=0), "--nodes 0"),
        (dict(script="a.py", launcher="mpirun"), "--launcher 'mpirun'"),
        (dict(script="a.py", mem_per_gpu="lots"), "not a SLURM size"),
        (dict(script="a.py", signal="USR1@soon"), "--signal"),
        (dict(script="a.py", job_name="a/b"), "--job-name"),
        (dict(script="a.py", extra_sbatch=("constraint=a100",)), "is not an option"),
        (dict(script="a.py", array="1-x"), "is not an sbatch array"),
        (dict(script="a.py", mail_type="END,LATER"), "LATER unknown"),
        (dict(script="a.py", ntasks=3, nodes=2), "not a multiple of --nodes 2"),
        (dict(script="a.py", gpu_visibility="some"), "--gpu-visibility 'some' unknown"),
        (dict(script="a.py", binds=("/a",)), "without --container IMAGE"),
        (dict(script="a.py", container="i.sif", binds=("/a,/b",)), "is not SRC[:DST[:OPTS]]"),
        (dict(script="a.py", qos=""), "is empty"),
    ],
)
def test_spec_validation(bad, fragment):
    kwargs = dict(time="01:00:00") | bad
    with pytest.raises(ConfigError, match=re.escape(fragment)):
        SlurmJobSpec(**kwargs)


@pytest.mark.parametrize(
    "text, seconds",
    [
        ("30", 1800),
        ("01:30:00", 5400),
        ("2-00:00:00", 172800),
        ("1-12", 129600),
        ("10:30", 630),
        ("1-12:30", 131400),
        ("0", 0),
        ("UNLIMITED", -1),
        ("infinite", -1),
    ],
)
def test_parse_time(text, seconds):
    from trainscale.launch.slurm.spec import format_time, parse_time

    assert parse_time(text) == seconds
    assert parse_time(format_time(seconds)) == seconds


def test_a_container_job_without_its_kit_stops_with_the_fix(tmp_path):
    spec = SlurmJobSpec(script="/t/x.py", profile="local-test", time="5", container="/img", output_dir=tmp_path)
    text = render(spec, builtin("local-test"), kit_dir=tmp_path / "no-kit")
    check = "\n".join(line for line in text.splitlines() if line.startswith(("KIT=", '[ -f "$KIT')))
    done = subprocess.run(["bash", "-c", check], capture_output=True, text=True)
    assert done.returncode == 1 and "the job kit" in done.stderr and "is missing" in done.stderr
    assert "trainscale slurm --submit" in done.stderr


def test_profile_caches_are_set_and_env_overrides_them():
    spec = SlurmJobSpec(script="/t/x.py", profile="lumi", time="5", account="p", env={"HF_HOME": "/flash/p/hf"})
    text = render(spec, builtin("lumi"))
    profile_line = 'export HF_HOME="/scratch/${SLURM_JOB_ACCOUNT}/${USER}/cache/huggingface"  # profile'
    assert profile_line in text and "export TOKENIZERS_PARALLELISM=false  # profile" in text
    assert text.index(profile_line) < text.index("export HF_HOME=/flash/p/hf  # command")  # the later export wins


def test_nodes_sharing_one_machines_cores_are_not_bound_by_slurm():
    """local-test's nodes are one machine: SLURM's default binding cannot lay out one rank per node four
    CPUs wide on two real cores (issue 35 item 6e)."""
    spec = SlurmJobSpec(script="train.py", profile="local-test", nodes=2, gpus_per_node=1, time="5", launcher="srun")
    text = render(spec, builtin("local-test"))
    assert "--cpus-per-task=4" in text and "--cpu-bind=none" in text
    assert "--cpu-bind" not in render(spec, dataclasses.replace(builtin("local-test"), shares_cores=False))
