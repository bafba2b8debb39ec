"""Faults on real processes: a SIGKILLed rank, a hung rank, rendezvous failures, jobs side by side."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest
import torch
from helpers.cli import in_process

FAST_CNN = ["--workload", "cnn", "--data", "synthetic", "--samples", "512", "--batch-size", "16", "--log-every", "0"]


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "SLURM_", "TRAINSCALE_FAULT"))
    }
    env.update(extra)
    return env


def start(args: list[str], cwd: Path, **extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trainscale", *args],
        cwd=cwd,
        env=_env(**extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def here(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """The same command in this process: where the launch is under test, not the launcher's own process."""
    return in_process(*args, cwd=cwd, drop=("RANK", "WORLD_SIZE", "MASTER_", "SLURM_", "TRAINSCALE_FAULT"))


def run(args: list[str], cwd: Path, timeout: float = 240, **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainscale", *args],
        cwd=cwd,
        env=_env(**extra),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def worker_pid(launcher: subprocess.Popen, rank: int) -> int | None:
    for child in psutil.Process(launcher.pid).children(recursive=True):
        try:
            if child.name() == f"ts-rank{rank}":  # a worker of a workload, forked from the launch's forkserver
                return child.pid
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return None


def weights(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(sorted(ckpt_dir.glob("ckpt-*.pt"))[-1], weights_only=True)["model"]


def kill_rank_after_first_checkpoint(proc: subprocess.Popen, ckpt_dir: Path, rank: int = 1) -> float:
    wait_for(lambda: any(ckpt_dir.glob("ckpt-*.pt")), 120, "the first checkpoint")
    pid = wait_for(lambda: worker_pid(proc, rank), 30, f"rank {rank}'s pid")
    assert proc.poll() is None, "training ended before the fault could be injected"
    os.kill(pid, signal.SIGKILL)
    return time.monotonic()


SIX_EPOCHS = [
    "run",
    "--nproc-per-node",
    "2",
    "--log-dir",
    "logs",
    *FAST_CNN,
    "--epochs",
    "6",
    "--checkpoint-every",
    "8",
]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict[str, torch.Tensor]:
    """The final weights of SIX_EPOCHS run straight through: what an interrupted run must end with."""
    cwd = tmp_path_factory.mktemp("uninterrupted")
    reference = here([*SIX_EPOCHS, "--checkpoint-dir", "clean"], cwd)
    assert reference.returncode == 0, reference.stderr
    return weights(cwd / "clean")


def test_sigkilled_rank_restarts_and_resumes_to_identical_weights(tmp_path, uninterrupted):
    proc = start([*SIX_EPOCHS[:1], "--max-restarts", "1", *SIX_EPOCHS[1:], "--checkpoint-dir", "faulty"], tmp_path)
    killed_at = kill_rank_after_first_checkpoint(proc, tmp_path / "faulty")
    out, err = proc.communicate(timeout=300)
    recovered = time.monotonic() - killed_at
    assert proc.returncode == 0, err
    assert "Resumed from" in out
    a = weights(tmp_path / "faulty")
    for key in uninterrupted:
        assert torch.equal(a[key], uninterrupted[key]), key
    print(f"recovered and finished {recovered:.1f}s after the SIGKILL")


def test_sigkilled_rank_without_restarts_fails_fast_and_is_named(tmp_path):
    proc = start(
        [
            "run",
            "--nproc-per-node",
            "2",
            "--log-dir",
            "logs",
            *FAST_CNN,
            "--epochs",
            "50",
            "--checkpoint-every",
            "8",
            "--checkpoint-dir",
            "ck",
        ],
        tmp_path,
    )
    killed_at = kill_rank_after_first_checkpoint(proc, tmp_path / "ck")
    _, err = proc.communicate(timeout=120)
    elapsed = time.monotonic() - killed_at
    assert proc.returncode != 0
    assert elapsed < 30, f"took {elapsed:.1f}s to notice the dead rank"
    assert f"first failing rank: 1 on {socket.gethostname()}" in err and "killed by SIGKILL" in err
    print(f"failed {elapsed:.1f}s after the SIGKILL")


def test_hung_rank_becomes_a_named_error_and_nothing_is_left_behind(tmp_path):
    started = time.monotonic()
    proc = start(
        ["run", "--nproc-per-node", "2", "--log-dir", "logs", *FAST_CNN, "--timeout", "5"],
        tmp_path,
        TRAINSCALE_FAULT="hang:rank=1:step=3",
    )
    pids = set()
    while proc.poll() is None and len(pids) < 2:  # remember the workers to check they are gone
        pids |= (
            {c.pid for c in psutil.Process(proc.pid).children(recursive=True) if c.name().startswith("ts-rank")}
            if psutil.pid_exists(proc.pid)
            else set()
        )
        time.sleep(0.05)
    _, err = proc.communicate(timeout=5 + 60 + 60)
    elapsed = time.monotonic() - started
    assert proc.returncode != 0
    assert "rank(s) 1 did not arrive" in err and "gradient all-reduce" in err and "within 5s" in err, err[-4000:]
    # the summary names the hung rank as the root cause, and shows where it hangs (its heartbeat's answer)
    assert "Root cause: rank(s) 1 hung (stopped participating)" in err and "rank 1's Python stack" in err
    assert "in maybe_inject" in err and "— the hung rank" in err, err[-4000:]
    assert elapsed < 5 + 60 + 30
    assert not [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    empty = [p for p in tmp_path.glob("logs/*/hangs/stacks-rank*.txt") if not p.stat().st_size]
    assert not empty, empty  # a watchdog's file that nothing was written to
    print(f"hang reported {elapsed:.1f}s after start (timeout 5s)")


HUNG_IN_ITS_LOOP = textwrap.dedent("""\
    import time

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")  # gloo's own timeout: 30 minutes
    for step in range(1000):
        if dist.get_rank() == 1 and step == 3:
            while True:
                time.sleep(1)  # rank 1 hangs in its loop
        dist.all_reduce(torch.ones(4))
""")


def test_the_hang_timeout_ends_a_hung_plain_script_with_the_culprit_as_root_cause(tmp_path):
    """issue 46 item 5: a hang was named at ~21 s, and then the job waited out gloo's 30 minutes."""
    (tmp_path / "hang.py").write_text(HUNG_IN_ITS_LOOP)
    started = time.monotonic()
    proc = run(
        ["run", "--nproc-per-node", "2", "--log-dir", "logs", "--hang-timeout", "10", "hang.py"], tmp_path, timeout=180
    )
    elapsed = time.monotonic() - started
    err = proc.stderr
    assert proc.returncode == 124, err[-4000:]
    host = socket.gethostname()
    assert (
        f"Root cause: rank(s) 1 hung (stopped participating) — rank 1 on {host} (pid " in err
        and "): step -1, at hang.py:10 in <module>" in err
    ), err[-4000:]
    assert "no progress for 10s" in err and "rank 1's Python stack" in err and "time.sleep(1)" in err, err[-4000:]
    assert elapsed < 120, f"took {elapsed:.0f}s"
    report = here(["report", "logs/latest", "--text"], tmp_path)
    assert "Root cause: rank(s) 1 hung (stopped participating) — rank 1 on" in report.stdout, report.stdout
    assert "traceback is in its" not in report.stdout
    print(f"the hang ended the run {elapsed:.0f}s after start (--hang-timeout 10)")


def test_a_hang_ended_by_the_hang_timeout_restarts_the_group_under_max_restarts(tmp_path):
    """A hang is a failure like a crash: with --max-restarts the group restarts (NVIDIA's resiliency extension's
    in-job restart does the same); here rank 1 hangs on the first attempt only, the second finishes."""
    script = HUNG_IN_ITS_LOOP.replace("range(1000)", "range(20)").replace(
        "dist.get_rank() == 1 and step == 3",
        'dist.get_rank() == 1 and step == 3 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"',
    )
    (tmp_path / "hang.py").write_text("import os\n" + script)
    proc = run(
        ["run", "--nproc-per-node", "2", "--log-dir", "logs", "--hang-timeout", "10", "--max-restarts", "1", "hang.py"],
        tmp_path,
        timeout=240,
    )
    err = proc.stderr
    assert proc.returncode == 0, err[-4000:]
    restarted = [line for line in err.splitlines() if line.startswith("trainscale: attempt 1 of 2 failed")]
    assert restarted and "restarting all ranks (attempt 2 of 2)" in restarted[0], err[-4000:]
    assert "(exit code 124: rank(s) 1 hung (stopped participating) — rank 1 on" in restarted[0], restarted[0]
    assert "no progress for 10s" in err and "rank(s) 1 did not arrive" in err, err[-4000:]


@pytest.mark.parametrize("rendezvous", ["c10d", "static"])
def test_missing_node_ends_with_a_rendezvous_timeout(tmp_path, rendezvous):
    script = tmp_path / "noop.py"
    script.write_text("print('never runs')\n")
    port = _free_port()
    # torchrun's two spellings of a 2-node job, as the courses write them; only node 0 is started
    where = (
        ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
        if rendezvous == "c10d"
        else ["--master-addr", "127.0.0.1", "--master-port", str(port), "--node-rank", "0"]
    )
    started = time.monotonic()
    proc = run(
        [
            "run",
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            *where,
            "--rdzv-timeout",
            "8",
            "--log-dir",
            "logs",
            str(script),
        ],
        tmp_path,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == 2
    assert "not all of the 2 node(s) arrived within 8s" in proc.stderr and "Hint:" in proc.stderr
    assert elapsed < 8 + 30
    print(f"rendezvous timeout reported after {elapsed:.1f}s (limit 8s)")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unresolvable_master_is_reported_before_start(tmp_path):
    proc = here(
        ["run", "--rdzv-endpoint", "no-such-host.invalid:29400", "--log-dir", "logs", "--workload", "cnn"], tmp_path
    )
    assert proc.returncode == 2 and "'no-such-host.invalid' does not resolve" in proc.stderr
    assert not (tmp_path / "logs").exists()


def test_busy_port_is_reported_naming_host_and_port(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = here(["run", "--rdzv-endpoint", f"127.0.0.1:{port}", "--log-dir", "logs", "--workload", "cnn"], tmp_path)
    assert proc.returncode == 2 and f"port {port} on 127.0.0.1" in proc.stderr and "not free" in proc.stderr


def test_two_jobs_on_one_host_never_join_each_other(tmp_path):
    script = tmp_path / "join_check.py"
    script.write_text(
        textwrap.dedent("""
        import os, sys
        import torch, torch.distributed as dist
        import trainscale
        with trainscale.init() as rt:
            mine = torch.tensor([float(sys.argv[1])])
            seen = [torch.zeros(1) for _ in range(rt.world_size)]
            dist.all_gather(seen, mine)
            print("TOKENS", rt.world_size, sorted(int(t.item()) for t in seen), flush=True)
    """)
    )
    jobs = [
        start(["run", "--nproc-per-node", "2", "--log-dir", f"logs{i}", str(script), str(token)], tmp_path)
        for i, token in enumerate((111, 222))
    ]
    outputs = [job.communicate(timeout=120) for job in jobs]
    for job, (out, err), token in zip(jobs, outputs, (111, 222)):
        assert job.returncode == 0, err
        assert f"TOKENS 2 [{token}, {token}]" in out


@pytest.mark.parametrize("to", ["launcher", "every-process"])
def test_usr1_checkpoints_at_a_step_boundary_and_a_rerun_matches_an_uninterrupted_run(tmp_path, uninterrupted, to):
    """SLURM's warning signal, delivered to the launcher (forwarded to the workers) or, as srun delivers
    it, to every process of the launch (the workers' forkserver too, which must not die of it): the
    workers agree on a step, checkpoint and stop; running the same command again finishes the job exactly."""
    common = SIX_EPOCHS
    proc = start([*common, "--checkpoint-dir", "pre"], tmp_path)
    wait_for(lambda: worker_pid(proc, 0) and worker_pid(proc, 1), 60, "both workers")
    # wait until training is under way: the first checkpoint (step 8) appears
    wait_for(lambda: any((tmp_path / "pre").glob("ckpt-*.pt")), 120, "the first checkpoint")
    signalled = time.monotonic()
    if to == "launcher":
        proc.send_signal(signal.SIGUSR1)
    else:  # srun signals every process of its step, whatever their session: the workers are in their own
        for process in [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]:
            with contextlib.suppress(psutil.NoSuchProcess):
                process.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=120)
    stopped = time.monotonic() - signalled
    assert proc.returncode == 0, err
    assert "Preempted (SIGUSR1) at step" in out and "run the same command again" in out
    rerun = here([*common, "--checkpoint-dir", "pre"], tmp_path)
    assert rerun.returncode == 0 and "Resumed from" in rerun.stdout, rerun.stderr
    a = weights(tmp_path / "pre")
    for key in uninterrupted:
        assert torch.equal(a[key], uninterrupted[key]), key
    print(f"checkpointed and stopped {stopped:.1f}s after SIGUSR1")


@pytest.mark.parametrize("rendezvous", ["default", "static"])
def test_stores_listen_on_loopback_only_for_a_single_node_run(tmp_path, rendezvous):
    """Secure default: the rendezvous and worker stores bind the chosen interface, not every address,
    whether trainscale picks the port or the user names it (torch's static rendezvous:
    ``--master-addr 127.0.0.1 --master-port P``)."""
    script = tmp_path / "wait.py"
    script.write_text(
        textwrap.dedent("""
        import pathlib, sys, time
        import trainscale
        with trainscale.init() as rt:
            go = pathlib.Path(sys.argv[1])
            pathlib.Path(sys.argv[1] + f".ready{rt.rank}").touch()
            while not go.exists():
                time.sleep(0.05)
            rt.barrier()
    """)
    )
    go = tmp_path / "go"
    port = _free_port()
    where = ["--master-addr", "127.0.0.1", "--master-port", str(port)] if rendezvous == "static" else []
    proc = start(["run", "--nproc-per-node", "2", *where, "--log-dir", "logs", str(script), str(go)], tmp_path)
    try:
        wait_for(lambda: all((tmp_path / f"go.ready{r}").exists() for r in (0, 1)), 120, "both ranks")
        family = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        listening = [
            c.laddr for c in psutil.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN and c.pid in family
        ]
    finally:
        go.touch()
    assert proc.wait(timeout=60) == 0
    assert listening, "no listening socket found"
    assert {addr.ip for addr in listening} == {"127.0.0.1"}, listening
    if rendezvous == "static":
        assert port in {addr.port for addr in listening}  # the store the user named, on loopback only
