"""`trainscale slurm ... --submit --watch` end to end on the local 2-node cluster, in both launch modes.

Each job runs world size 4 (2 nodes x 2 ranks, gloo) with the repo's venv python; all files go
under pytest's tmp_path (job output and trainscale's job records). Job times are printed (-s).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "scripts" / "ddp_check.py"
LAUNCHERS = ("torchrun", "srun")


def trainscale(tmp_path: Path, *argv: str, timeout: float = 280) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRAINSCALE_STATE_DIR": str(tmp_path / "state")}
    return subprocess.run(
        [sys.executable, "-m", "trainscale", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=tmp_path,
    )


def submit_watch(tmp_path: Path, launcher: str, *target: str) -> tuple[subprocess.CompletedProcess[str], str, float]:
    t0 = time.monotonic()
    done = trainscale(
        tmp_path,
        "slurm",
        "--profile",
        "local-test",
        "--nodes",
        "2",
        "--gpus-per-node",
        "2",
        "--time",
        "00:05:00",
        "--launcher",
        launcher,
        "--output-dir",
        str(tmp_path / "jobs"),
        "--python",
        sys.executable,
        "--submit",
        "--watch",
        "--poll",
        "0.5",
        "--watch-timeout",
        "240",
        *target,
    )
    seconds = time.monotonic() - t0
    m = re.search(r"submitted job (\d+)", done.stderr)
    assert m, f"no job submitted:\n{done.stdout}\n{done.stderr}"
    print(
        f"\n[e2e] {launcher} {' '.join(target[:2])}: job {m.group(1)} ended in {seconds:.1f}s "
        f"(submit to final state)\n{done.stdout}"
    )
    return done, m.group(1), seconds


def rank_log(tmp_path: Path, job_id: str, rank: int) -> str:
    done = trainscale(tmp_path, "jobs", job_id, "--rank", str(rank), timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


ENV_LINE = re.compile(
    r"ENV rank=(?P<rank>\d+) local_rank=(?P<local>\d+) node_rank=(?P<node_rank>\d+) "
    r"world=(?P<world>\d+) local_world=(?P<local_world>\d+) source=(?P<source>\S+) "
    r"node=(?P<node>\S+) RANK=(?P<env_rank>\S+) LOCAL_RANK=(?P<env_local>\S+)"
)


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_ranks_see_their_place_and_agree(slurm_cluster, tmp_path, launcher):
    done, job_id, _ = submit_watch(tmp_path, launcher, str(SCRIPT), "--steps", "5")
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    envs, sums = {}, {}
    for rank in range(4):  # `trainscale jobs JOBID --rank R` for every rank, 0 and 3 included
        text = rank_log(tmp_path, job_id, rank)
        env = ENV_LINE.search(text)
        assert env, f"rank {rank}'s log has no ENV line:\n{text}"
        envs[rank] = env.groupdict()
        check = re.search(r"CHECKSUM rank=(\d+) start=(\w+) final=(\w+)", text)
        assert check and int(check.group(1)) == rank, text
        sums[rank] = check.group(2, 3)
    for rank, e in envs.items():
        assert (int(e["rank"]), int(e["world"]), int(e["local_world"])) == (rank, 4, 2), e
        assert rank == int(e["node_rank"]) * 2 + int(e["local"]), e  # block layout: 2 ranks per node
        # srun mode exports torchrun's variables per task (TRAINSCALE_EXPORT_TORCHRUN_ENV): both modes have them
        assert (e["env_rank"], e["env_local"], e["source"]) == (e["rank"], e["local"], "torchrun"), e
    nodes_of: dict[str, set[str]] = {}
    for e in envs.values():
        nodes_of.setdefault(e["node_rank"], set()).add(e["node"])
    assert sorted(nodes_of) == ["0", "1"] and all(len(v) == 1 for v in nodes_of.values()), envs
    assert set().union(*nodes_of.values()) == {"n1", "n2"}, envs  # each node rank is one SLURM node
    if launcher == "srun":  # ranks come straight from SLURM: node rank = SLURM_NODEID, n1 first
        assert nodes_of == {"0": {"n1"}, "1": {"n2"}}
    starts, finals = {s for s, _ in sums.values()}, {f for _, f in sums.values()}
    assert len(starts) == 1 and len(finals) == 1, sums  # same init, same final parameters on all ranks
    assert starts != finals  # and training changed them


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_failing_rank_is_named(slurm_cluster, tmp_path, launcher):
    done, job_id, _ = submit_watch(tmp_path, launcher, str(SCRIPT), "--steps", "50", "--fail-rank", "3")
    assert done.returncode == 1, f"{done.stdout}\n{done.stderr}"
    assert f"Job {job_id} (trainscale-ddp_check) FAILED" in done.stdout
    assert "First failing rank: rank 3" in done.stdout, done.stdout
    assert "RuntimeError: deliberate failure on rank 3 at step 1" in done.stdout
    logs = trainscale(tmp_path, "jobs", job_id, timeout=60)
    assert "First failing rank: rank 3" in logs.stdout, logs.stdout
    assert "deliberate failure on rank 3" in rank_log(tmp_path, job_id, 3)
    report = trainscale(tmp_path, "report", job_id, "--text", timeout=120)  # the test cluster keeps no accounting
    assert report.returncode == 0, report.stderr
    assert f"job {job_id} ended FAILED: First failing rank: rank 3" in report.stdout, report.stdout


HUNG_IN_ITS_LOOP = """\
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # gloo's own timeout: 30 minutes
for step in range(1000):
    if dist.get_rank() == 3 and step == 3:
        while True:
            time.sleep(1)  # rank 3 (node 2) hangs in its loop
    dist.all_reduce(torch.ones(4))
"""


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_the_hang_timeout_ends_a_hung_job_with_the_culprit_as_root_cause(slurm_cluster, tmp_path, launcher):
    """issue 46 item 5 as a SLURM job: a job's node-hours are what a hang burns; gloo would wait 30 minutes."""
    (tmp_path / "hang.py").write_text(HUNG_IN_ITS_LOOP)
    done, job_id, seconds = submit_watch(tmp_path, launcher, "--hang-timeout", "10", str(tmp_path / "hang.py"))
    out = done.stdout + done.stderr
    assert done.returncode == 124, out  # as `trainscale run`'s
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"Job {job_id} (trainscale-hang) FAILED"), out
    # the summary's second line names the rank that failed first (one that waited), the third why: rank 3 hung
    # (torchrun mode: which node rank 3 has is the rendezvous's choice)
    assert lines[1].startswith("First failing rank: rank "), out
    cause = r"Root cause: rank\(s\) 3 hung \(stopped participating\) — rank 3 on n[12] \(pid \d+\)"
    assert re.match(cause, lines[2]), out
    assert "hang.py:10 in <module>" in lines[2] and "time.sleep(1)  # rank 3 (node 2) hangs" in out, out
    report = trainscale(tmp_path, "report", job_id, "--text", timeout=120)
    assert report.returncode == 0, report.stderr
    assert "rank(s) 3 hung" in report.stdout and "traceback is in its" not in report.stdout, report.stdout
    assert seconds < 200, f"the hung job took {seconds:.0f}s from submission to its end"


def test_jobs_lists_and_cancel_cancels(slurm_cluster, tmp_path):
    from trainscale.launch.slurm import explain, watch

    # 2 ranks on one node: 2 CPUs per task (the test nodes declare 4 CPUs on a 2-core machine, and srun
    # cannot lay out one task wider than the real cores)
    done = trainscale(
        tmp_path,
        "slurm",
        "--profile",
        "local-test",
        "--nodes",
        "1",
        "--gpus-per-node",
        "2",
        "--time",
        "00:05:00",
        "--launcher",
        "srun",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--python",
        sys.executable,
        "--submit",
        str(SCRIPT),
        "--steps",
        "100000000",
    )
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.strip()
    assert job_id.isdigit()
    listed = trainscale(tmp_path, "jobs", timeout=60)
    assert listed.returncode == 0
    row = [line for line in listed.stdout.splitlines() if line.startswith(job_id + " ")]
    assert row and "trainscale-ddp_check" in row[0] and ("RUNNING" in row[0] or "PENDING" in row[0]), listed.stdout
    cancelled = trainscale(tmp_path, "jobs", job_id, "--cancel", timeout=60)
    assert cancelled.returncode == 0, cancelled.stderr
    final = watch(job_id, poll_s=0.5, timeout_s=120)
    assert final.state == "CANCELLED"
    assert f"Job {job_id} (trainscale-ddp_check) CANCELLED: was cancelled" in explain(final)
    again = trainscale(tmp_path, "jobs", job_id, "--cancel", timeout=60)  # scancel itself says nothing and exits 0
    assert again.returncode == 0 and f"job {job_id} already ended CANCELLED: nothing to cancel" in again.stderr
    unknown = trainscale(tmp_path, "jobs", "999999", "--cancel", timeout=60)
    assert unknown.returncode == 2 and "SLURM knows no job 999999: nothing cancelled" in unknown.stderr
    assert "cancelled job" not in unknown.stderr


def test_busy_master_port_is_named_before_training(slurm_cluster, tmp_path):
    import socket

    with socket.socket() as busy:  # n1 is this machine (127.0.0.1): hold the port the job asks for
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = trainscale(
            tmp_path,
            "slurm",
            "--profile",
            "local-test",
            "--nodes",
            "2",
            "--gpus-per-node",
            "2",
            "--time",
            "00:05:00",
            "--launcher",
            "srun",
            "--output-dir",
            str(tmp_path / "jobs"),
            "--python",
            sys.executable,
            "--master-port",
            str(port),
            "--submit",
            "--watch",
            "--poll",
            "0.5",
            "--watch-timeout",
            "120",
            str(SCRIPT),
        )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAILED" in done.stdout
    assert f"port {port} on n1" in done.stdout  # the batch output's last lines, shown by the explanation
    assert not list((tmp_path / "jobs").glob("*/*/rank-*.out"))  # no rank was started


def test_dry_run_asks_the_real_scheduler(slurm_cluster, tmp_path):
    """sbatch's spellings on the command line, and sbatch --test-only's answer after the script."""
    args = [
        "slurm",
        "--profile",
        "local-test",
        "-N",
        "2",
        "--gpus-per-node",
        "2",
        "-t",
        "5",
        "-J",
        "probe",
        "--output-dir",
        str(tmp_path / "jobs"),
        "--python",
        sys.executable,
    ]
    ok = trainscale(tmp_path, *args, "--dry-run", str(SCRIPT), timeout=60)
    assert ok.returncode == 0, ok.stderr
    assert "#SBATCH --job-name=probe" in ok.stdout and "#SBATCH --time=00:05:00" in ok.stdout
    assert re.search(r"sbatch --test-only accepts the job: .*Job \d+ to start at .* on nodes n\[1-2\]", ok.stderr), (
        ok.stderr
    )
    # more nodes than the partition has: the lint knows it from sinfo (a profile's numbers cannot), and the
    # scheduler's refusal is still asked for and said
    too_big = trainscale(tmp_path, *args[:4], "3", *args[5:], "--test-only", str(SCRIPT), timeout=60)
    assert too_big.returncode == 2, too_big.stderr
    assert "error: --nodes 3 but partition debug (sinfo -p debug) has 2 node(s)" in too_big.stderr, too_big.stderr
    assert "sbatch --test-only REFUSES the job" in too_big.stderr
    memory = trainscale(tmp_path, *args, "--mem", "900G", "--dry-run", str(SCRIPT), timeout=60)
    assert (
        memory.returncode == 2
        and "900 GB per node asked for (--mem 900G), but the nodes of partition debug (sinfo -p debug) have 7.81 GB"
        in memory.stderr
    ), memory.stderr
    # --dry-run too: a script SLURM refuses is no success (it exited 0, the refusal after the whole script);
    # a feature no node has is what only the scheduler knows
    refused = trainscale(tmp_path, *args, "--sbatch=--constraint=nosuch", "--dry-run", str(SCRIPT), timeout=60)
    assert refused.returncode == 1 and "sbatch --test-only REFUSES the job" in refused.stderr, refused.stderr
    assert "#SBATCH --constraint=nosuch" in refused.stdout
    # another cluster's job (LUMI's partition): this scheduler cannot judge it, so it is not asked and not refused
    lumi = trainscale(
        tmp_path,
        "slurm",
        "--profile",
        "lumi",
        "-A",
        "project_1",
        "-N",
        "2",
        "-t",
        "5",
        "--python",
        sys.executable,
        "--output-dir",
        str(tmp_path / "jobs"),
        "--dry-run",
        str(SCRIPT),
        timeout=60,
    )
    assert lumi.returncode == 0, lumi.stderr
    assert (
        "this machine's SLURM has no partition 'standard-g' (it has debug): it is not the cluster profile lumi "
        "describes"
        in lumi.stderr
        and "sbatch --test-only was not asked" in lumi.stderr
    ), lumi.stderr
    assert "REFUSES" not in lumi.stderr
    assert not (tmp_path / "jobs").exists()  # nothing written, nothing submitted
    # this cluster's profile with a partition it lacks: a mistake, which the scheduler refuses in its own words,
    # and a refused --submit leaves nothing behind
    typo = [
        "slurm",
        "--profile",
        "local-test",
        "-N",
        "2",
        "-p",
        "nosuchpart",
        "-t",
        "10",
        "--python",
        sys.executable,
        "--output-dir",
        str(tmp_path / "jobs"),
    ]
    dry = trainscale(tmp_path, *typo, "--dry-run", str(SCRIPT), timeout=60)
    assert dry.returncode == 1 and "sbatch --test-only REFUSES the job: " in dry.stderr, dry.stderr
    assert "invalid partition specified: nosuchpart" in dry.stderr, dry.stderr
    refused = trainscale(tmp_path, *typo, "--submit", str(SCRIPT), timeout=60)
    assert refused.returncode == 2 and "invalid partition specified: nosuchpart" in refused.stderr, refused.stderr
    assert not (tmp_path / "jobs").exists()  # no run directory, no latest link
