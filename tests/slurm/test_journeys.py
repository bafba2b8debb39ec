"""From `trainscale run` to `trainscale slurm --submit` on the local 2-node cluster: the job sees what the
user meant.

A course layout (scripts/train.py importing the sibling package mypkg/ through sys.path relative to its
own file, scripts/course/) runs under `trainscale run`, then as a job in both launch modes, in the
stock-image sandbox, and with a module's Python; each rank records its arguments (job-time variables
expanded, a literal `$` kept), where mypkg came from (the run's snapshot, not the working tree) and the
Python that ran it. SLURM's own step failure and an unreachable scheduler are named for what they are.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

COURSE = Path(__file__).resolve().parent / "scripts" / "course"
NOTE = "cost \\$5, not $(date)"  # as the user's shell passes '...' in single quotes: \$ is a literal $
SEEN_NOTE = "cost $5, not $(date)"


def course(tmp_path: Path) -> Path:
    """The course's folder as a student has it: a git repository with the model package beside scripts/."""
    root = tmp_path / "course"
    shutil.copytree(COURSE, root, ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-C", str(root), "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "course"], check=True)
    return root


def trainscale(cwd: Path, env: dict[str, str], *argv: str, timeout: float = 280) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainscale", *argv], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def job_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {**os.environ, "TRAINSCALE_STATE_DIR": str(tmp_path / "state"), "OUT_BASE": str(tmp_path / "out"), **extra}


def submit_watch(
    root: Path, env: dict[str, str], *options: str, cwd: Path | None = None, timeout: float = 240
) -> tuple[str, Path, str]:
    """Submit the course's scripts/train.py from ``cwd`` (default: the course's root); (job id, run directory,
    what --watch printed)."""
    t0 = time.monotonic()
    cwd = cwd or root
    # one rank per node: what the journey needs is two nodes (per-node ranks are tests/slurm/test_slurm_e2e.py's),
    # 2 CPUs per task: the test nodes declare 4 on 2 real cores, and srun cannot lay a task out wider than those
    done = trainscale(
        cwd,
        env,
        "slurm",
        "-N",
        "2",
        "--gpus-per-node",
        "1",
        "-c",
        "2",
        "-t",
        "00:05:00",
        "--output-dir",
        str(root.parent / "jobs"),
        *options,
        "--submit",
        "--watch",
        "--poll",
        "0.5",
        "--watch-timeout",
        str(timeout),
        os.path.relpath(root / "scripts" / "train.py", cwd),
        "--output-path",
        "$OUT_BASE/job-$SLURM_JOB_ID",
        "--note",
        NOTE,
    )
    m = re.search(r"submitted job (\d+) .*; run directory (\S+) ", done.stderr)
    assert m, f"not submitted:\n{done.stdout}\n{done.stderr}"
    print(
        f"\n[journeys] {' '.join(options[:6])}: job {m.group(1)} ended in {time.monotonic() - t0:.1f}s\n"
        f"{done.stdout[-600:]}"
    )
    assert done.returncode == 0 and "COMPLETED" in done.stdout, f"{done.stdout}\n{done.stderr}"
    return m.group(1), Path(m.group(2)), done.stdout


def ranks(out: Path, job_id: str, run_dir: Path, world: int = 2) -> list[dict]:
    """Every rank's record: its place, the arguments it got, and mypkg imported from the run's snapshot."""
    found = [json.loads(p.read_text()) for p in sorted((out / f"job-{job_id}").glob("rank-*.json"))]
    assert sorted(r["rank"] for r in found) == list(range(world)), found
    snapshot = run_dir / "src" / "course"
    for r in found:
        assert r["world_size"] == world
        assert r["argv"] == ["--output-path", f"{out}/job-{job_id}", "--note", SEEN_NOTE], r["argv"]
        # the copy, though the job ran in course/ (found through the working directory or scripts/..)
        assert os.path.normpath(r["mypkg"]) == str(snapshot / "mypkg" / "__init__.py"), r
        assert r["script"] == str(snapshot / "scripts" / "train.py"), r
    assert len({r["grad_sum"] for r in found}) == 1, found  # one all-reduce over the whole world
    return found


@pytest.mark.parametrize("launcher, where", [("torchrun", "above"), ("srun", "root")])
def test_a_script_importing_its_sibling_package_runs_as_a_job(slurm_cluster, tmp_path, launcher, where):
    """Submitted from above the course (mypkg only reachable relative to the script's own file), and from the
    course's root (mypkg also in the working directory: the job still imports the snapshot's)."""
    root = course(tmp_path)
    env = job_env(tmp_path)
    cwd = tmp_path if where == "above" else root
    if launcher == "torchrun":  # the seam: what works under `trainscale run` ...
        local = trainscale(
            cwd,
            env,
            "run",
            "--nproc-per-node",
            "2",
            "course/scripts/train.py",
            "--output-path",
            str(tmp_path / "local"),
            "--note",
            "here",
            timeout=180,
        )
        assert local.returncode == 0, local.stdout + local.stderr
        seen = json.loads((tmp_path / "local" / "rank-1.json").read_text())["mypkg"]
        assert os.path.normpath(seen) == str(root / "mypkg" / "__init__.py")
    # ... works as a job, with the script's arguments naming job-time variables
    job_id, run_dir, _ = submit_watch(
        root, env, "--profile", "local-test", "--launcher", launcher, "--python", sys.executable, cwd=cwd
    )
    ranks(tmp_path / "out", job_id, run_dir)
    record = json.loads((run_dir / "submission.json").read_text())["snapshot"]
    assert (record["root"], record["mode"], record["script"]) == (str(root), "git", "scripts/train.py")
    assert record["files"] == 3 and re.fullmatch(r"[0-9a-f]{64}", record["sha256"]), record


def test_the_sibling_package_in_a_stock_image(slurm_cluster, sandbox, tmp_path):
    """The stock image (torch, no trainscale) sees the snapshot: the run directory is bound, the kit boots."""
    root = course(tmp_path)
    env = job_env(
        tmp_path,
        PATH=f"{sandbox['shim']}{os.pathsep}{os.environ['PATH']}",
        TRAINSCALE_CONFIG_DIR=str(sandbox["config"]),
    )
    job_id, run_dir, _ = submit_watch(
        root,
        env,
        "--profile",
        "local-test-containers",
        "--launcher",
        "srun",
        "--container",
        str(sandbox["image"]),
        "--container-setup",
        "$WITH_CONDA",
    )
    assert {r["python"] for r in ranks(tmp_path / "out", job_id, run_dir)} == {"/opt/python/bin/python3"}


def test_a_modules_python_runs_the_job(slurm_cluster, sandbox, tmp_path):
    """The Cyclone line: `--module 'load PyTorch/...'` and no --python. The job runs the python3 the module
    puts on PATH (here the stock image's Python, outside any container: torch, no trainscale), with the job
    kit; the dry run names that Python and its torch, probed through the same module line."""
    import torch

    root = course(tmp_path)
    python = sandbox["image"] / "opt" / "python"
    module = (
        f'() {{ if [ "$1" = load ]; then export PATH="{python}/bin:$PATH" '
        f'LD_LIBRARY_PATH="{python}/lib${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"; fi; }}'
    )
    env = job_env(tmp_path, **{"BASH_FUNC_module%%": module})  # stands in for Lmod: the batch shell finds `module`
    options = ("--profile", "local-test", "--launcher", "srun", "--module", "load PyTorch/2.13.0-foss-2025a")
    dry = trainscale(
        root,
        env,
        "slurm",
        "-N",
        "2",
        "--gpus-per-node",
        "2",
        "-t",
        "5",
        *options,
        "--dry-run",
        "scripts/train.py",
        "--output-path",
        "o",
        timeout=120,
    )
    assert dry.returncode == 0, dry.stderr
    assert (
        f"note: the job runs python3 as found on the job's PATH after its module lines: {python}/bin/python3 "
        f"(Python {sys.version.split()[0]}), torch {torch.__version__}"
    ) in dry.stderr, dry.stderr
    job_id, run_dir, _ = submit_watch(root, env, *options)
    assert {r["python"] for r in ranks(tmp_path / "out", job_id, run_dir)} == {f"{python}/bin/python3"}
    batch = (run_dir / f"{job_id}.out").read_text()
    assert (
        f"trainscale: the job's Python is {python}/bin/python3 (Python {sys.version.split()[0]}), torch "
        f"{torch.__version__}" in batch
    )


def test_a_step_slurm_cannot_lay_out_is_named_with_its_fix(slurm_cluster, tmp_path):
    """One task four CPUs wide on nodes that declare four CPUs over two real cores: the profile's default
    (one rank per node in srun mode) runs, as the profile's nodes share their cores (issue 35 item 6e: the
    user had to find -c 2); bound by SLURM all the same, srun's own failure, which no rank's traceback can
    explain."""
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    submit = (
        "slurm",
        "--profile",
        "local-test",
        "-N",
        "1",
        "--gpus-per-node",
        "1",
        "-t",
        "5",
        "--launcher",
        "srun",
        "--python",
        sys.executable,
        "--output-dir",
        str(tmp_path / "jobs"),
        "--submit",
        "--watch",
        "--poll",
        "0.5",
        "--watch-timeout",
        "120",
    )
    ran = trainscale(tmp_path, job_env(tmp_path), *submit, str(script), timeout=180)
    assert ran.returncode == 0 and "COMPLETED" in ran.stdout, ran.stdout + ran.stderr
    done = trainscale(tmp_path, job_env(tmp_path), *submit, "-c", "4", "--cpu-bind", "cores", str(script), timeout=180)
    print(f"\n[journeys] a step SLURM cannot lay out:\n{done.stdout}")
    assert done.returncode == 1 and "FAILED" in done.stdout, done.stdout + done.stderr
    assert "SLURM could not start the ranks: the step's tasks do not fit the CPUs" in done.stdout
    assert "SLURM said: srun: error:" in done.stdout and "Unable to layout tasks on given cpus" in done.stdout
    assert "Hint: give each task fewer CPUs (-c/--cpus-per-task)" in done.stdout
    assert "traceback" not in done.stdout.lower()


def test_an_unreachable_scheduler_is_not_a_refusal(slurm_cluster, tmp_path):
    conf = tmp_path / "slurm.conf"  # the test cluster's configuration, its controller on a port nobody serves
    conf.write_text(re.sub(r"SlurmctldPort=\d+", "SlurmctldPort=1", (slurm_cluster.dir / "slurm.conf").read_text()))
    script = tmp_path / "hello.py"
    script.write_text("print('hello')\n")
    env = job_env(tmp_path, SLURM_CONF=str(conf))
    args = (
        "slurm",
        "--profile",
        "local-test",
        "-N",
        "1",
        "-t",
        "5",
        "--python",
        sys.executable,
        "--output-dir",
        str(tmp_path / "jobs"),
    )
    dry = trainscale(tmp_path, env, *args, "--dry-run", str(script), timeout=150)
    assert dry.returncode == 0, dry.stderr
    assert "could not ask the scheduler (sbatch --test-only: " in dry.stderr and "Unable to contact" in dry.stderr
    assert "the job was not checked by SLURM" in dry.stderr and "REFUSES" not in dry.stderr
