"""`trainscale doctor --network` on real ranks: through the local launcher, under `trainscale run`, and as srun
tasks would start it (SLURM variables, rank 0 creating the store itself)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from helpers.cli import in_process

LAUNCHER_PREFIXES = (
    "RANK",
    "LOCAL_",
    "WORLD_SIZE",
    "GROUP_",
    "MASTER_",
    "SLURM_",
    "TORCHELASTIC",
    "OMPI_",
    "PMI_",
    "TRAINSCALE_",
)


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(LAUNCHER_PREFIXES)}
    env.update(GLOO_SOCKET_IFNAME="lo", **extra)
    return env


def _here(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The same command in this process (the launch is under test, not the command's own process)."""
    return in_process(*args, cwd=cwd, env={"GLOO_SOCKET_IFNAME": "lo"}, drop=LAUNCHER_PREFIXES)


def _network(report: dict) -> dict[tuple[int, str], dict]:
    return {(f["rank"], f["check"]): f for f in report["findings"] if f["rank"] is not None}


def _assert_passing_all_reduce(report: dict, ranks: int) -> None:
    network = _network(report)
    assert report["ranks_reporting"] == ranks
    for rank in range(ranks):
        reduce = network[(rank, "all-reduce")]
        assert reduce["level"] == "ok", reduce
        assert f"sum over {ranks} ranks correct" in reduce["message"] and reduce["detail"]["median_ms"] > 0
        assert network[(rank, "master address")]["level"] == "ok"
        assert network[(rank, "master port")]["level"] == "ok"
        transport = network[(rank, "transport")]  # the network the collectives used: TCP for gloo ranks
        assert transport["level"] == "ok" and transport["message"].startswith("gloo (CPU ranks): TCP sockets")


def test_doctor_nproc_2_reports_a_passing_all_reduce_from_both_ranks(tmp_path):
    proc = _here("doctor", "--nproc", "2", "--network", "--json", "--size-mib", "1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    _assert_passing_all_reduce(json.loads(proc.stdout), 2)
    assert list(tmp_path.iterdir()) == []  # logs and the rank files went to a temporary directory


def test_doctor_module_under_trainscale_run_prints_one_report_on_rank0(tmp_path):
    proc = _here(
        "run",
        "--nproc-per-node",
        "2",
        "--log-dir",
        "logs",
        "-m",
        "trainscale.doctor",
        "--network",
        "--size-mib",
        "1",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("Summary:") == 1
    for rank in (0, 1):
        assert f"rank {rank} all-reduce" in proc.stdout and "sum over 2 ranks correct" in proc.stdout
    assert "torchrun: rank 0/2" in proc.stdout


def test_doctor_as_srun_tasks_rank0_creates_the_store_and_both_ranks_pass(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    common = dict(
        SLURM_JOB_ID="4242",
        SLURM_STEP_ID="0",
        SLURM_NODEID="0",
        SLURM_NTASKS="2",
        SLURM_TASKS_PER_NODE="2",
        SLURM_JOB_NODELIST="localhost",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        OMP_NUM_THREADS="1",
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "trainscale.doctor", "--network", "--json", "--size-mib", "1", "--timeout", "60"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_clean_env(**common, SLURM_PROCID=str(r), SLURM_LOCALID=str(r)),
        )
        for r in (0, 1)
    ]
    outputs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert outputs[1][0] == ""  # rank 1 sent its findings to rank 0 and printed nothing
    report = json.loads(outputs[0][0])
    _assert_passing_all_reduce(report, 2)
    assert "is free for rank 0's store" in _network(report)[(0, "master port")]["message"]
    assert _network(report)[(1, "master port")]["detail"]["port"] == port


def test_unresolvable_master_under_a_launch_env_is_an_error_naming_host_and_port(tmp_path):
    env = _clean_env(
        RANK="1",
        LOCAL_RANK="1",
        WORLD_SIZE="2",
        LOCAL_WORLD_SIZE="2",
        GROUP_RANK="0",
        MASTER_ADDR="no-such-host.invalid",
        MASTER_PORT="29555",
        TORCHELASTIC_RESTART_COUNT="0",
    )
    proc = subprocess.run(
        [sys.executable, "-m", "trainscale.doctor", "--network"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 1
    line = next(ln for ln in proc.stdout.splitlines() if "rank 1 master address" in ln)
    assert line.startswith("[ERROR]") and "no-such-host.invalid" in line and "29555" in line


def doctor_network_on_rank(size_mib: float) -> tuple[list, str]:
    """Runs inside a run_on_ranks process (torchrun-style variables, no agent store: rank 0 makes it)."""
    from trainscale.doctor import run_network
    from trainscale.env import detect
    from trainscale.topology import current_affinity

    findings, outcome = run_network(
        detect(),
        dict(os.environ),
        host=socket.gethostname(),
        affinity=current_affinity(),
        timeout_s=60,
        numel=int(size_mib * 2**18),
    )
    return [f.to_dict() for f in findings], outcome


def test_run_network_without_an_agent_store_gathers_every_rank_on_rank0():
    from helpers.multiproc import run_on_ranks

    results = run_on_ranks(doctor_network_on_rank, 2, 0.25, timeout=120)
    assert [results[r][1] for r in (0, 1)] == ["gathered", "sent"]
    report = {"ranks_reporting": 2, "findings": results[0][0]}
    _assert_passing_all_reduce(report, 2)
    assert "is free for rank 0's store" in _network(report)[(0, "master port")]["message"]
