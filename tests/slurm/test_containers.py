"""Stock site containers on the real 2-node SLURM test cluster: an image with Python and torch but no
trainscale (tests/helpers/container_image.py), run by a singularity-compatible command over a real
bubblewrap sandbox (tests/containers/singularity) in which the project's venv is not visible (the
``sandbox`` fixture: tests/slurm/conftest.py).

Both launch modes, a torchrun-style and a SLURM-style course script (tests/conformance/scripts),
`exec` with an in-container set-up line and `run` through the image's runscript, a host set-up line,
a per-job bind; an image that cannot run the job fails in its first seconds naming image and fix,
and the probe says so before submission. The profile is a user profile that extends local-test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "conformance" / "scripts"


def env_for(sandbox, tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{sandbox['shim']}{os.pathsep}{os.environ['PATH']}",
        "TRAINSCALE_CONFIG_DIR": str(sandbox["config"]),
        "TRAINSCALE_STATE_DIR": str(tmp_path / "state"),
    }


def trainscale(sandbox, tmp_path: Path, *argv: str, timeout: float = 280) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainscale", *argv],
        env=env_for(sandbox, tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def job_args(sandbox, tmp_path: Path, launcher: str, *extra: str) -> list[str]:
    return [
        "slurm",
        "--profile",
        "local-test-containers",
        "-N",
        "2",
        "--gpus-per-node",
        "2",
        "-t",
        "00:05:00",
        "--launcher",
        launcher,
        "--output-dir",
        str(tmp_path / "jobs"),
        "--container",
        str(sandbox["image"]),
        *extra,
    ]


def results(out: Path, world: int) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted(out.glob("rank-*.json"))]
    assert sorted(r["rank"] for r in found) == list(range(world)), found
    for r in found:
        env = r["env"]
        assert int(env["RANK"]) == int(env["SLURM_PROCID"]) == r["rank"], env
        assert int(env["LOCAL_RANK"]) == int(env["SLURM_LOCALID"]) == r["rank"] % 2, env
        assert int(env["NODE_RANK"]) == r["rank"] // 2, env
        assert not r["trainscale_importable"], "the stock image must not have trainscale"
    assert len({r["checksum"] for r in found}) == 1, found
    assert {r["env"]["SLURMD_NODENAME"] for r in found} == {"n1", "n2"}
    return found


def submit_watch(sandbox, tmp_path: Path, launcher: str, *extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    done = trainscale(
        sandbox,
        tmp_path,
        *job_args(
            sandbox, tmp_path, launcher, "--submit", "--watch", "--poll", "0.5", "--watch-timeout", "240", *extra
        ),
    )
    seconds = time.monotonic() - t0
    print(f"\n[containers] {launcher}: {' '.join(extra[:6])}... ended in {seconds:.1f}s\n{done.stdout[-800:]}")
    return done, seconds


def assert_recorded(sandbox, tmp_path: Path, done: subprocess.CompletedProcess[str], world: int) -> None:
    """Every rank's steps were recorded inside the stock image (the kit's recorder on the image's torch), and
    `trainscale report JOB` reads them."""
    job_id = re.search(r"submitted job (\d+)", done.stderr).group(1)
    report = trainscale(sandbox, tmp_path, "report", job_id, "--text", timeout=120)
    assert report.returncode == 0, report.stderr
    table = report.stdout.split("== Ranks ==", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    assert sorted(int(line.split()[0]) for line in table if line[:1].isdigit()) == list(range(world)), report.stdout


def test_torchrun_mode_exec_with_setup_line_runs_a_slurm_style_script(slurm_cluster, sandbox, tmp_path):
    """LUMI's older images: `singularity exec IMAGE` needs `$WITH_CONDA` first; the image's own torchrun
    starts the ranks; seed 004's script reads SLURM_PROCID/SLURM_LOCALID/NODE_RANK; data bound at /data."""
    data = tmp_path / "data-on-host"
    data.mkdir()
    out = tmp_path / "out"
    done, _ = submit_watch(
        sandbox,
        tmp_path,
        "torchrun",
        "--container-setup",
        "$WITH_CONDA",
        "--bind",
        f"{data}:/data",
        str(SCRIPTS / "ddp_srun_env.py"),
        "--data",
        "/data",
        "--out",
        str(out),
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "COMPLETED" in done.stdout
    results(out, 4)
    assert (data / "digits.pt").exists()  # written inside the container at /data, the job's own bind
    assert_recorded(sandbox, tmp_path, done, 4)
    batch = next((tmp_path / "jobs").glob("*/*.out")).read_text()
    assert "-m torch.distributed.run" in next((tmp_path / "jobs").glob("*/job.sbatch")).read_text()
    assert "master n1:" in batch


def test_srun_mode_run_form_with_host_setup_runs_a_torchrun_style_script(slurm_cluster, sandbox, tmp_path):
    """`singularity run`: the image's runscript sets up its Python; a host set-up line reaches the ranks."""
    out = tmp_path / "out"
    done, _ = submit_watch(
        sandbox,
        tmp_path,
        "srun",
        "--container-run",
        "--setup",
        "export JOB_SETUP_MARK=from-setup",
        str(SCRIPTS / "ddp_torchrun.py"),
        "--experiment-dir",
        str(tmp_path / "exp"),
        "--out",
        str(out),
    )
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    found = results(out, 4)
    assert {r["env"]["JOB_SETUP_MARK"] for r in found} == {"from-setup"}
    assert "singularity run" in next((tmp_path / "jobs").glob("*/job.sbatch")).read_text()
    assert_recorded(sandbox, tmp_path, done, 4)


def test_image_without_torch_fails_in_its_first_seconds_naming_image_and_fix(slurm_cluster, sandbox, tmp_path):
    """`exec` without the image's set-up finds a Python without torch. The probe refuses it before
    submission; submitted anyway, the job stops at its first step with the same diagnosis."""
    refused = trainscale(
        sandbox,
        tmp_path,
        *job_args(sandbox, tmp_path, "srun", "--dry-run", str(SCRIPTS / "ddp_torchrun.py")),
        timeout=120,
    )
    assert refused.returncode == 2
    assert re.search(r"error: python3 in .*pytorch-stock \(Python [\d.]+\) cannot import torch", refused.stderr), (
        refused.stderr
    )
    assert "--container-setup" in refused.stderr
    # what --submit would have sent, submitted without trainscale's checks
    from trainscale.launch.slurm import SlurmJobSpec, resolve
    from trainscale.launch.slurm.job import prepare_run
    from trainscale.profiles import load_profile

    jobs = tmp_path / "jobs"
    spec = SlurmJobSpec(
        script=str(SCRIPTS / "ddp_torchrun.py"),
        args=("--experiment-dir", "e", "--out", "o"),
        profile="local-test",
        nodes=2,
        gpus_per_node=2,
        time="00:05:00",
        launcher="srun",
        container=str(sandbox["image"]),
        output_dir=jobs,
    )
    plan = resolve(spec, load_profile("local-test"))
    script = prepare_run(spec, load_profile("local-test"), plan)
    env = env_for(sandbox, tmp_path)
    t0 = time.monotonic()
    job_id = (
        subprocess.run(
            ["sbatch", "--parsable", str(script)], env=env, capture_output=True, text=True, check=True, cwd=tmp_path
        )
        .stdout.strip()
        .split(";")[0]
    )
    state = slurm_cluster.wait_done(job_id, timeout=120)
    seconds = time.monotonic() - t0
    print(f"\n[containers] broken image: job {job_id} {state} after {seconds:.1f}s")
    assert state == "FAILED"
    text = (plan.run_dir / f"{job_id}.out").read_text()
    assert f"trainscale: error: the image {sandbox['image']} cannot run this job" in text
    assert "cannot import torch" in text and "hint:" in text and "--container-setup" in text
    assert not list(plan.run_dir.glob(f"{job_id}/rank-*.out"))  # no rank was started


def test_probe_names_a_missing_python_and_a_missing_trainscale(sandbox, tmp_path):
    missing = trainscale(
        sandbox,
        tmp_path,
        *job_args(
            sandbox, tmp_path, "srun", "--python", "/opt/venv/bin/python", "--dry-run", str(SCRIPTS / "ddp_torchrun.py")
        ),
        timeout=120,
    )
    assert missing.returncode == 2 and "/opt/venv/bin/python cannot be run inside" in missing.stderr, missing.stderr
    workload = trainscale(
        sandbox,
        tmp_path,
        *job_args(sandbox, tmp_path, "srun", "--container-setup", "$WITH_CONDA", "--dry-run", "--workload", "cnn"),
        timeout=120,
    )
    assert workload.returncode == 2 and "cannot import trainscale" in workload.stderr, workload.stderr
    assert "--system-site-packages" in workload.stderr and "--python VENV/bin/python" in workload.stderr
    fine = trainscale(
        sandbox,
        tmp_path,
        *job_args(
            sandbox,
            tmp_path,
            "torchrun",
            "--python",
            "/opt/python/bin/python3",
            "--dry-run",
            str(SCRIPTS / "ddp_torchrun.py"),
        ),
        timeout=120,
    )
    assert fine.returncode == 0, fine.stderr


def test_a_missing_module_system_is_a_clear_job_error(slurm_cluster, sandbox, tmp_path):
    done = trainscale(
        sandbox,
        tmp_path,
        "slurm",
        "--profile",
        "local-test",
        "-N",
        "1",
        "-t",
        "00:05:00",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--python",
        sys.executable,
        "--module",
        "load PyTorch/2.1.2-foss-2023a-CUDA-12.1.1",
        "--submit",
        "--watch",
        "--poll",
        "0.5",
        "--watch-timeout",
        "120",
        str(SCRIPTS / "ddp_torchrun.py"),
        "--experiment-dir",
        "e",
        "--out",
        "o",
    )
    assert done.returncode == 1 and "FAILED" in done.stdout, done.stdout + done.stderr
    assert "this job loads modules, but there is no `module` command on" in done.stdout


def test_a_requeue_from_an_image_without_scontrol_is_done_by_the_batch_step(slurm_cluster, sandbox, tmp_path):
    """issue 36 item 3, where Lightning's auto-requeue fails (Lightning#21404): the ranks run in a stock image with
    no ``scontrol`` (bound over by /dev/null here, as in images without SLURM's tools) and trainscale in a venv
    inside the image (README's LUMI recipe). On the warning, rank 0 leaves the marker, the batch step (on the
    host) requeues the job, and the requeued job resumes from its checkpoint to the end."""
    import importlib
    import shutil

    venv, site = tmp_path / "venv-ts", tmp_path / "site"
    subprocess.run(
        [
            "singularity",
            "exec",
            str(sandbox["image"]),
            "bash",
            "-c",
            f"$WITH_CONDA && python3 -m venv --system-site-packages {venv}",
        ],
        env=env_for(sandbox, tmp_path),
        check=True,
        capture_output=True,
        timeout=120,
    )
    site.mkdir()
    for name in ("trainscale", "psutil", "rich", "markdown_it", "mdurl", "pygments", "hostlist", "cloudpickle"):
        found = Path(importlib.import_module(name).__file__)  # what `pip install -e trainscale` would bring
        if found.name == "__init__.py":
            shutil.copytree(found.parent, site / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(found, site / found.name)
    py = f"python{sys.version_info.major}.{sys.version_info.minor}"
    (venv / "lib" / py / "site-packages" / "trainscale-copy.pth").write_text(f"{site}\n")
    done = trainscale(
        sandbox,
        tmp_path,
        "slurm",
        "--profile",
        "local-test-containers",
        "-N",
        "1",
        "--gpus-per-node",
        "1",
        "-t",
        "00:05:00",
        "--launcher",
        "srun",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--container",
        str(sandbox["image"]),
        "--python",
        str(venv / "bin" / "python"),
        "--bind",
        "/dev/null:/usr/bin/scontrol",
        "--bind",
        "/dev/null:/bin/scontrol",
        "--requeue",
        "--submit",
        "--workload",
        "cnn",
        "--data",
        "synthetic",
        "--samples",
        "1024",
        "--batch-size",
        "16",
        "--epochs",
        "1",
        "--checkpoint-every",
        "4",
        "--log-every",
        "0",
    )
    m = re.search(r"job (\d+) .*run directory (\S+)", done.stderr)
    assert done.returncode == 0 and m, done.stdout + done.stderr
    job, run_dir = m.group(1), Path(m.group(2))
    deadline = time.monotonic() + 180
    while not any((run_dir / "checkpoints").glob("ckpt-*.pt")):
        assert time.monotonic() < deadline, f"no checkpoint after 180 s: {(run_dir / f'{job}.out').read_text()}"
        time.sleep(0.2)
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job)
    state = slurm_cluster.wait_done(job, timeout=300)
    batch = (run_dir / f"{job}.out").read_text()
    ranks = "\n".join(p.read_text() for p in (run_dir / job).glob("rank-*.out"))
    assert state == "COMPLETED", batch[-3000:]
    assert "scontrol is not reachable here (container?)" in ranks, ranks[-3000:]
    assert f"trainscale: requeueing {job} from the batch step" in batch, batch[-3000:]
    assert slurm_cluster.job_fields(job).get("Restarts") == "1"
    assert "Resumed from" in ranks and "Attempt 2 of this job" in ranks, ranks[-3000:]


HUNG_IN_ITS_LOOP = """\
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # gloo's own timeout: 30 minutes
for step in range(1000):
    if dist.get_rank() == 3 and step == 3:
        while True:
            time.sleep(1)  # rank 3 hangs in its loop
    dist.all_reduce(torch.ones(4))
"""


def test_the_stories_hold_in_a_stock_image(slurm_cluster, sandbox, tmp_path):
    """The diagnoses with the kit's recorder and hang watch on the image's own torch: a straggler (torchrun mode,
    rank 3's DataLoader 15 ms slower per batch: named with its DataLoader in the report) and a hang (srun mode,
    --hang-timeout 10: the job ends with rank 3 as root cause and --watch's exit status 124)."""
    os.environ.update(STEPS="120", SLOW_RANK="3", SLOW_MS="15", OUT=str(tmp_path / "out"))
    try:
        done, _ = submit_watch(sandbox, tmp_path, "torchrun", "--container-run", str(SCRIPTS / "ddp_plain.py"))
    finally:
        for name in ("STEPS", "SLOW_RANK", "SLOW_MS", "OUT"):
            os.environ.pop(name)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    job_id = re.search(r"submitted job (\d+)", done.stderr).group(1)
    report = trainscale(sandbox, tmp_path, "report", job_id, "--text", timeout=120)
    assert re.search(r"\[problem\] straggler: rank 3 on n[12] ", report.stdout), report.stdout
    assert "fetching its batches from the DataLoader" in report.stdout, report.stdout

    (tmp_path / "hang.py").write_text(HUNG_IN_ITS_LOOP)
    hung, seconds = submit_watch(
        sandbox, tmp_path, "srun", "--container-run", "--hang-timeout", "10", str(tmp_path / "hang.py")
    )
    assert hung.returncode == 124, f"{hung.stdout}\n{hung.stderr}"
    assert re.search(r"^Root cause: rank\(s\) 3 hung \(stopped participating\) — rank 3 on n2 ", hung.stdout, re.M), (
        hung.stdout
    )
    assert "hang.py:10 in <module>" in hung.stdout and seconds < 200, hung.stdout
