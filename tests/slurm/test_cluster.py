"""The local 2-node test cluster behaves like a real SLURM cluster: multi-node srun
steps, requeue, signals to the batch script, and job states after the end."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:  # conftest modules are not importable by name (several share it)
    from conftest import SlurmCluster

CLUSTER_SH = Path(__file__).resolve().parent / "cluster.sh"

TASK_VARS = (
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURMD_NODENAME",
    "SLURM_STEP_ID",
    "SLURM_TASKS_PER_NODE",
    "SLURM_JOB_NODELIST",
)


def write_script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return path


def wait_for_file(path: Path, cluster: SlurmCluster, job_id: str, timeout: float = 120) -> None:
    """Poll until the job has created PATH; fail early if the job ends first."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        state = cluster.job_state(job_id)
        if state not in {"PENDING", "CONFIGURING", "RUNNING"}:
            pytest.fail(f"job {job_id} is {state} before writing {path}: {cluster.job_fields(job_id)}")
        if time.monotonic() > deadline:
            pytest.fail(f"job {job_id} did not write {path} within {timeout}s ({state})")
        time.sleep(0.1)


def test_two_nodes_two_tasks_each(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    fields = " ".join(f"${v}" for v in TASK_VARS)
    script = write_script(
        tmp_path / "tasks.sh",
        f"""srun bash -c 'echo "TASK {fields}"; env | sort > env.$SLURM_PROCID'\n""",
    )
    job_id = slurm_cluster.submit(script, "--nodes=2", "--ntasks-per-node=2", "--output=out.txt")
    assert slurm_cluster.wait_done(job_id) == "COMPLETED", (tmp_path / "out.txt").read_text()

    rows = [line.split()[1:] for line in (tmp_path / "out.txt").read_text().splitlines() if line.startswith("TASK ")]
    tasks = {int(row[0]): dict(zip(TASK_VARS, row)) for row in rows}
    assert len(rows) == 4 and sorted(tasks) == [0, 1, 2, 3]
    nodes, per_node = slurm_cluster.nodes, 2
    for procid, task in tasks.items():
        # Default block distribution: ranks fill the first node, then the next.
        assert task["SLURMD_NODENAME"] == nodes[procid // per_node], task
        assert int(task["SLURM_LOCALID"]) == procid % per_node, task
        assert task["SLURM_STEP_ID"] == "0", task  # the first srun of the job is step 0
        assert task["SLURM_TASKS_PER_NODE"] == f"{per_node}(x{len(nodes)})", task
        assert task["SLURM_JOB_NODELIST"] == "n[1-2]", task

    env3 = (tmp_path / "env.3").read_text()
    print(f"--- environment of task 3 (job {job_id}) ---\n{env3}")
    slurm_env = dict(line.split("=", 1) for line in env3.splitlines() if line.startswith("SLURM"))
    assert slurm_env["SLURM_JOB_ID"] == job_id
    assert slurm_env["SLURM_NTASKS"] == "4" and slurm_env["SLURM_NNODES"] == "2"
    assert slurm_env["SLURM_NODEID"] == "1"
    assert slurm_env["SLURM_CONF"] == slurm_cluster.env["SLURM_CONF"]


def test_requeue_restarts_a_running_job(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    script = write_script(
        tmp_path / "requeue.sh",
        """echo "run ${SLURM_RESTART_COUNT:-0}" >> runs.txt
if [ "${SLURM_RESTART_COUNT:-0}" -ge 1 ]; then exit 0; fi
touch running
while :; do sleep 1; done
""",
    )
    job_id = slurm_cluster.submit(script, "--output=out.txt", "--time=3")
    try:
        wait_for_file(tmp_path / "running", slurm_cluster, job_id)
        slurm_cluster.run("scontrol", "requeue", job_id)
        # A requeued job waits cred_expire (10 s on this cluster) before it may start again.
        assert slurm_cluster.wait_done(job_id, timeout=150) == "COMPLETED"
    finally:
        slurm_cluster.run("scancel", job_id, check=False)
    assert (tmp_path / "runs.txt").read_text().splitlines() == ["run 0", "run 1"]
    assert slurm_cluster.job_fields(job_id)["Restarts"] == "1"


def test_usr1_reaches_the_batch_script(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    script = write_script(
        tmp_path / "usr1.sh",
        """trap 'echo "USR1 in $SLURM_JOB_ID" > got_usr1; exit 0' USR1
touch trap_set
# `wait` returns as soon as a trapped signal arrives; a plain `sleep` would delay the trap.
while :; do sleep 1 & wait $!; done
""",
    )
    job_id = slurm_cluster.submit(script, "--output=out.txt", "--time=3")
    try:
        wait_for_file(tmp_path / "trap_set", slurm_cluster, job_id)
        slurm_cluster.run("scancel", "--signal=USR1", "--batch", job_id)
        assert slurm_cluster.wait_done(job_id) == "COMPLETED"
    finally:
        slurm_cluster.run("scancel", job_id, check=False)
    assert (tmp_path / "got_usr1").read_text() == f"USR1 in {job_id}\n"


def test_failed_job_state_in_scontrol_and_sacct(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    script = write_script(tmp_path / "fail.sh", "exit 3\n")
    job_id = slurm_cluster.submit(script, "--output=out.txt")
    assert slurm_cluster.wait_done(job_id) == "FAILED"
    assert slurm_cluster.job_fields(job_id)["ExitCode"] == "3:0"
    # No slurmdbd: plain sacct says accounting is disabled, but `sacct --completion`
    # reads the jobcomp/filetxt log and knows every finished job.
    sacct = slurm_cluster.run("sacct", "--completion", "-j", job_id, "-P", "-n", "-o", "JobID,State,ExitCode")
    assert sacct.stdout.split() == [f"{job_id}|FAILED|3:0"]
    plain = slurm_cluster.run("sacct", "-j", job_id, check=False)
    assert "accounting storage is disabled" in plain.stdout + plain.stderr


def test_cluster_sh_up_reuses_a_healthy_cluster(slurm_cluster: SlurmCluster) -> None:
    env = {**os.environ, "TRAINSCALE_TEST_CLUSTER_DIR": str(slurm_cluster.dir)}
    for command in ("check", "up"):
        proc = subprocess.run(["bash", str(CLUSTER_SH), command], env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
    assert "already up (reused)" in proc.stderr
    assert f"SLURM_CONF={slurm_cluster.env['SLURM_CONF']}" in proc.stdout
    sinfo = slurm_cluster.run("sinfo", "-h", "-N", "-o", "%N %P").stdout.split("\n")
    assert sorted(filter(None, sinfo)) == [f"{n} {slurm_cluster.partition}*" for n in slurm_cluster.nodes]


def test_cluster_sh_up_after_a_controller_died_starts_an_empty_cluster(slurm_cluster: SlurmCluster) -> None:
    """CI once failed 54 tests at setup ("nodes not idle after 60s", both nodes `mix`): `up` restarted a cluster
    whose controller had died, and the controller brought back the jobs it had saved. A 1-node cluster of its
    own (its own directory and ports: the shared one stays as it is)."""
    cluster_dir = Path(tempfile.mkdtemp(prefix="ts-1n-", dir="/tmp"))  # short: munge's socket path has a limit
    cluster_dir.chmod(0o755)  # munged wants its socket's directories searchable by all
    env = {
        **os.environ,
        "TRAINSCALE_TEST_CLUSTER_NODES": "1",
        "TRAINSCALE_TEST_CLUSTER_DIR": str(cluster_dir),
        "SLURM_CONF": str(cluster_dir / "slurm.conf"),
    }

    def run(*command: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)

    try:
        up = run("bash", str(CLUSTER_SH), "up")
        assert up.returncode == 0, up.stderr
        job = run("sbatch", "--parsable", "--output=/dev/null", "--wrap", "sleep 300").stdout.strip()
        deadline = time.monotonic() + 60
        while run("squeue", "-h", "-j", job, "-o", "%T").stdout.strip() != "RUNNING":
            assert time.monotonic() < deadline, "the job did not start"
            time.sleep(0.5)
        os.kill(int((cluster_dir / "run" / "slurmctld.pid").read_text()), signal.SIGKILL)
        up = run("bash", str(CLUSTER_SH), "up")
        assert up.returncode == 0, up.stderr
        assert run("squeue", "-h", "-o", "%i").stdout.split() == []  # the saved job did not come back
        assert run("sinfo", "-h", "-N", "-o", "%N %t").stdout.split() == ["n1", "idle"]
    finally:
        run("bash", str(CLUSTER_SH), "down")
        shutil.rmtree(cluster_dir, ignore_errors=True)
