"""Long runs and many runs on the real 2-node cluster: a chain past the time limit, the requeue cap, a
sweep as one array job, `trainscale run` inside an salloc, `attach`, and submissions that an edit
after --submit cannot change. Wall times are printed (-s)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import torch
from helpers.cli import trainscale, wait_for

CNN = [
    "--workload",
    "cnn",
    "--data",
    "synthetic",
    "--samples",
    "1024",
    "--batch-size",
    "16",
    "--epochs",
    "3",
    "--checkpoint-every",
    "4",
    "--log-every",
    "0",
]
JOB = [
    "--profile",
    "local-test",
    "-N",
    "2",
    "--gpus-per-node",
    "2",
    "-t",
    "00:10:00",
    "--launcher",
    "srun",
    "-c",
    "2",
    "--python",
    sys.executable,
]


def submitted(done: subprocess.CompletedProcess[str]) -> tuple[str, Path]:
    m = re.search(r"job (\d+) .*run directory (\S+)", done.stderr)
    assert done.returncode == 0 and m, f"{done.stdout}\n{done.stderr}"
    return m.group(1), Path(m.group(2))


def final_weights(ckdir: Path) -> dict[str, torch.Tensor]:
    return torch.load(sorted(ckdir.glob("ckpt-*.pt"))[-1], weights_only=True)["model"]


def test_chain_finishes_in_link_two_and_cancels_link_three(slurm_cluster, tmp_path):
    t0 = time.monotonic()
    first, run_dir = submitted(
        trainscale(tmp_path, "slurm", *JOB, "--output-dir", str(tmp_path / "jobs"), "--chain", "3", "--submit", *CNN)
    )
    links = (run_dir / "links").read_text().split()
    assert len(links) == 3 and links[0] == first
    listed = trainscale(tmp_path, "jobs", timeout=60).stdout
    row = [line for line in listed.splitlines() if line.startswith(first + "+")]
    assert row and "chain" in row[0] and all(f"{j}:" in row[0] for j in links), listed  # one line for the chain
    ckdir = run_dir / "checkpoints"
    wait_for(lambda: any(ckdir.glob("ckpt-*.pt")), 180, "link 1's first checkpoint")
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", first)  # the time limit's warning, now
    states = {j: slurm_cluster.wait_done(j, timeout=240) for j in links}
    seconds = time.monotonic() - t0
    assert states == {links[0]: "COMPLETED", links[1]: "COMPLETED", links[2]: "CANCELLED"}, states
    batch1, batch2 = (run_dir / f"{links[0]}.out").read_text(), (run_dir / f"{links[1]}.out").read_text()
    assert "stopped (stopped for the next link of the chain)" in batch1, batch1
    assert f"training finished in link {links[1]}" in batch2 and "cancelling the chain's other links" in batch2
    assert (run_dir / "finished").read_text().strip() == f"job {links[1]}"
    log2 = trainscale(tmp_path, "jobs", links[1], "--rank", "0", timeout=60).stdout
    assert "Resumed from" in log2, log2
    # the same training, never interrupted, same ranks and threads per rank (bitwise comparable); the job
    # gave each rank its CPUs per rank (2) or fewer, where the node's cores were fewer: its records say
    meta = json.loads((run_dir / "metrics" / "rank-0.jsonl").read_text().splitlines()[0])
    assert meta["kind"] == "meta" and 1 <= meta["threads"] <= 2
    ref = trainscale(
        tmp_path,
        "run",
        "--nproc-per-node",
        "4",
        "--log-dir",
        str(tmp_path / "ref-logs"),
        *CNN,
        "--checkpoint-dir",
        str(tmp_path / "ref"),
        env={"OMP_NUM_THREADS": str(meta["threads"])},
    )
    assert ref.returncode == 0, ref.stderr
    ours, theirs = final_weights(ckdir), final_weights(tmp_path / "ref")
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    print(f"\n[chain] 3 links, finished in link 2: {seconds:.1f}s from submission to the chain's end")


def test_requeue_cap_reached_ends_the_job_clearly(slurm_cluster, tmp_path):
    t0 = time.monotonic()
    one_rank = [
        "--profile",
        "local-test",
        "-N",
        "1",
        "--gpus-per-node",
        "1",
        "-t",
        "00:10:00",
        "--launcher",
        "srun",
        "-c",
        "2",
        "--python",
        sys.executable,
    ]  # the cap is the job's, whatever its ranks
    job, run_dir = submitted(
        trainscale(
            tmp_path,
            "slurm",
            *one_rank,
            "--output-dir",
            str(tmp_path / "jobs"),
            "--requeue",
            "--max-requeues",
            "0",
            "--submit",
            *CNN,
        )
    )
    wait_for(lambda: any((run_dir / "checkpoints").glob("ckpt-*.pt")), 180, "the first checkpoint")
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job)
    state = slurm_cluster.wait_done(job, timeout=240)
    seconds = time.monotonic() - t0
    batch = (run_dir / f"{job}.out").read_text()
    assert state == "FAILED" and slurm_cluster.job_fields(job)["ExitCode"].startswith("75:"), batch
    assert "stopped: requeue cap reached: requeued 0 time(s), --max-requeues 0; not requeued" in batch, batch
    assert slurm_cluster.job_fields(job).get("Restarts", "0") == "0"
    print(f"\n[requeue cap] job {job}: stopped by the cap {seconds:.1f}s after submission")


def test_one_array_task_requeued_alone_resumes_its_own_checkpoints(slurm_cluster, tmp_path):
    """issue 36 item 3: SLURM's warning to one task of an array requeues that task only (``JOBID_TASK``, not the
    array, which Lightning requeues whole), and it resumes from its own directory's checkpoints."""
    done = trainscale(
        tmp_path,
        "sweep",
        "--grid",
        "lr=1e-3,3e-3",
        "--profile",
        "local-test",
        "-N",
        "1",
        "--gpus-per-node",
        "1",
        "-t",
        "00:10:00",
        "--python",
        sys.executable,
        "--requeue",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--submit",
        "--workload",
        "cnn",
        "--data",
        "synthetic",
        "--samples",
        "2048",
        "--batch-size",
        "16",
        "--epochs",
        "1",
        "--checkpoint-every",
        "4",
        "--log-every",
        "0",
    )
    m = re.search(r"submitted array job (\d+) \(2 tasks", done.stderr)
    assert done.returncode == 0 and m, done.stderr
    array, run_dir = m.group(1), Path(done.stdout.strip())
    wait_for(lambda: any((run_dir / "task-1" / "checkpoints").glob("ckpt-*.pt")), 180, "task 1's first checkpoint")
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", f"{array}_1")
    wait_for(
        lambda: all(
            (run_dir / f"task-{i}" / "finished").exists() or (run_dir / f"task-{i}" / "failed").exists()
            for i in range(2)
        ),
        300,
        "both array tasks",
    )
    assert all((run_dir / f"task-{i}" / "finished").exists() for i in range(2))
    restarts = {i: slurm_cluster.job_fields(f"{array}_{i}").get("Restarts") for i in range(2)}
    assert restarts == {0: "0", 1: "1"}, restarts
    logs = {p.relative_to(run_dir): p.read_text(errors="replace") for p in run_dir.rglob("*.out") if p.is_file()}
    resumed = [name for name, text in logs.items() if "Resumed from" in text]
    assert len(resumed) == 1 and "task-1/checkpoints/ckpt-" in logs[resumed[0]], sorted(map(str, logs))


def test_sweep_two_by_two_as_one_array_job(slurm_cluster, tmp_path):
    t0 = time.monotonic()
    done = trainscale(
        tmp_path,
        "sweep",
        "--grid",
        "lr=1e-3,3e-3 batch-size=16,32",
        "--max-parallel",
        "2",
        "--profile",
        "local-test",
        "-N",
        "1",
        "--gpus-per-node",
        "1",
        "-t",
        "00:10:00",
        "--python",
        sys.executable,
        "--output-dir",
        str(tmp_path / "jobs"),
        "--submit",
        "--workload",
        "cnn",
        "--data",
        "synthetic",
        "--samples",
        "256",
        "--max-steps",
        "4",
        "--log-every",
        "0",
    )
    m = re.search(r"submitted array job (\d+) \(4 tasks, --array=0-3%2\)", done.stderr)
    assert done.returncode == 0 and m, done.stderr
    run_dir = Path(done.stdout.strip())
    wait_for(
        lambda: all(
            (run_dir / f"task-{i}" / "finished").exists() or (run_dir / f"task-{i}" / "failed").exists()
            for i in range(4)
        ),
        300,
        "the four array tasks",
    )
    status = trainscale(tmp_path, "sweep", "status", str(run_dir), timeout=60)
    seconds = time.monotonic() - t0
    assert status.returncode == 0, status.stderr
    rows = [line.split() for line in status.stdout.splitlines()[1:5]]
    assert sorted((r[1], r[2]) for r in rows) == [("1e-3", "16"), ("1e-3", "32"), ("3e-3", "16"), ("3e-3", "32")]
    assert all(r[3] == "finished" for r in rows), status.stdout
    losses = [float(r[4]) for r in rows]
    assert losses == sorted(losses)  # best (lowest held-out loss) first
    assert "4 of 4 task(s) finished; best first by test_loss" in status.stdout
    assert (run_dir / "results.csv").read_text().startswith("task,lr,batch-size,state,test_loss")
    metrics = json.loads((run_dir / "task-3" / "metrics.json").read_text())
    assert metrics["options"]["lr"] == 3e-3 and metrics["options"]["batch_size"] == 32
    print(f"\n[sweep] 2x2 array job {m.group(1)}: {seconds:.1f}s from submission to the gathered table")


def test_run_inside_an_allocation_spreads_over_its_nodes(slurm_cluster, tmp_path):
    script = tmp_path / "where.py"
    script.write_text(
        textwrap.dedent("""
        import os, torch.distributed as dist
        dist.init_process_group("gloo")
        print("RANK", dist.get_rank(), "OF", dist.get_world_size(), "ON", os.environ.get("SLURMD_NODENAME"), flush=True)
        dist.destroy_process_group()
    """)
    )
    t0 = time.monotonic()
    done = subprocess.run(
        [
            "salloc",
            "-N",
            "2",
            "-t",
            "5",
            sys.executable,
            "-m",
            "trainscale",
            "run",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--all-ranks",
            "--log-dir",
            str(tmp_path / "logs"),
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=tmp_path,
        env={**os.environ, "TRAINSCALE_STATE_DIR": str(tmp_path / "state")},
    )
    seconds = time.monotonic() - t0
    assert done.returncode == 0, done.stdout + done.stderr
    assert "one agent per node on n1,n2 (srun --overlap)" in done.stderr
    placed = set(re.findall(r"RANK (\d) OF 2 ON (n\d)", done.stdout))
    assert {r for r, _ in placed} == {"0", "1"} and {n for _, n in placed} == {"n1", "n2"}, done.stdout
    print(f"\n[salloc] trainscale run --nnodes 2 inside salloc -N 2: {seconds:.1f}s")


def test_an_edit_after_submit_does_not_reach_the_queued_job(slurm_cluster, tmp_path):
    code = tmp_path / "project"
    (code / "helpers").mkdir(parents=True)
    (code / "helpers" / "__init__.py").write_text("VERSION = 'as submitted'\n")
    script = code / "train.py"
    script.write_text("from helpers import VERSION\nprint('SCRIPT as submitted, HELPERS', VERSION, flush=True)\n")
    subprocess.run(["git", "init", "-q", str(code)], check=True)
    subprocess.run(["git", "-C", str(code), "-c", "user.email=t@t", "-c", "user.name=t", "add", "."], check=True)
    subprocess.run(
        ["git", "-C", str(code), "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "v1"], check=True
    )
    commit = subprocess.run(
        ["git", "-C", str(code), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    job, run_dir = submitted(
        trainscale(
            tmp_path,
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
            "--snapshot",
            str(code),
            "--sbatch=--hold",
            "--submit",
            str(script),
        )
    )
    script.write_text("print('SCRIPT edited after submission', flush=True)\n")  # the job is still held
    (code / "helpers" / "__init__.py").write_text("VERSION = 'edited'\n")
    slurm_cluster.run("scontrol", "release", job)
    assert slurm_cluster.wait_done(job, timeout=120) == "COMPLETED"
    out = trainscale(tmp_path, "jobs", job, "--rank", "0", timeout=60).stdout
    assert "SCRIPT as submitted, HELPERS as submitted" in out, out
    record = json.loads((run_dir / "submission.json").read_text())
    assert record["git"] == {"commit": commit, "dirty": False}
    assert record["versions"]["torch"] == torch.__version__ and record["spec"]["snapshot"] == str(code)
    assert record["command"][:2] == ["trainscale", "slurm"]


def test_attach_runs_a_command_on_a_running_jobs_node(slurm_cluster, tmp_path):
    script = tmp_path / "wait.py"
    script.write_text("import time, os\nopen(os.environ['TRAINSCALE_RUN_DIR'] + '/up', 'w').close()\ntime.sleep(300)\n")
    job, run_dir = submitted(
        trainscale(
            tmp_path,
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
            "--submit",
            str(script),
        )
    )
    try:
        wait_for(lambda: (run_dir / "up").exists(), 120, "the job to run")
        node = slurm_cluster.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()  # n1, or n2 when n1 is busy
        done = trainscale(tmp_path, "jobs", job, "--attach", "--", "printenv", "SLURMD_NODENAME", timeout=60)
        assert node in ("n1", "n2") and done.returncode == 0 and done.stdout.strip() == node, done.stdout + done.stderr
    finally:
        slurm_cluster.run("scancel", job, check=False)
