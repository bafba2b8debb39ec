"""How `trainscale run` and its workers end: the exit status tells the truth, restarts are announced,
workers die with their launcher, a signal to the launcher is answered in one line (docs/launch.md)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

# torchrun-style, nothing of trainscale: RANK/LOCAL_RANK, init, DDP, a few steps, the loss averaged for
# the log, destroy, return or sys.exit(0). The model lives at module level (nanoGPT's layout). With
# torch 2.13 and gloo, before trainscale's bootstrap ended such a worker itself, 3 of 20 two-rank runs
# ending in sys.exit(0) aborted at interpreter exit (SIGABRT, "terminate called without an active exception").
PLAIN_DDP = textwrap.dedent("""
    import os
    import sys
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        x = torch.randn(16, 32)
        loss = nn.functional.cross_entropy(model(x), (x.sum(1) > 0).long())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)  # the loss averaged over the ranks, for the log line
    if rank == 0:
        print(f"loss {mean.item() / dist.get_world_size():.4f}")
    dist.destroy_process_group()
    if sys.argv[1] == "sys.exit":
        sys.exit(0)
""")


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RANK", "WORLD_SIZE", "MASTER_", "SLURM_", "TORCHELASTIC_", "TRAINSCALE_RUN_DIR"))
    }
    return {**env, **extra}


def _run(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trainscale", "run", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# The abort above, made certain: a C-level exit handler that aborts, as a C++ static's destructor may,
# planted after the script's last line. An interpreter that exits normally runs it; a worker that ends
# the way trainscale ends it (its Python exit work done, then os._exit) does not.
EXIT_TIME_ABORT = textwrap.dedent("""
    import ctypes
    libc = ctypes.CDLL(None)
    libc.__cxa_atexit(ctypes.cast(libc.abort, ctypes.c_void_p), None, None)  # how C++ registers a static's destructor
""")


@pytest.mark.slow
def test_a_plain_ddp_script_that_returns_exits_0_every_time(tmp_path):
    """A script whose interpreter would abort at exit (certain here, not one run in three) exits 0 whether it
    falls off its end or calls sys.exit(0); and three unmodified runs at once, the busy machine that makes
    torch's own abort likelier, exit 0 too."""
    script = tmp_path / "plain_ddp.py"
    script.write_text(PLAIN_DDP)
    planted = tmp_path / "aborting_ddp.py"
    planted.write_text(PLAIN_DDP.replace("if sys.argv[1]", EXIT_TIME_ABORT + "if sys.argv[1]"))
    unchanged = subprocess.run(
        [sys.executable, planted, "return"],
        env=_env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="0"),
        capture_output=True,
    )
    assert unchanged.returncode == -signal.SIGABRT, unchanged  # the planted abort is real without trainscale
    runs = [(planted, "return"), (planted, "sys.exit"), (script, "return"), (script, "sys.exit")]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainscale",
                "run",
                "--nproc-per-node",
                "2",
                "--log-dir",
                f"logs{k}",
                str(path),
                ending,
            ],
            cwd=tmp_path,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for k, (path, ending) in enumerate(runs)
    ]
    failed = [
        f"{path.name} {ending}: {err[-2000:]}"
        for (path, ending), proc in zip(runs, procs)
        for _, err in [proc.communicate(timeout=300)]
        if proc.returncode != 0
    ]
    assert not failed, "\n".join(failed)


RESTARTING = textwrap.dedent("""
    import atexit, ctypes, os, pathlib, sys, time
    import torch
    import trainscale
    from trainscale.checkpoint import Checkpointer

    out = pathlib.Path(sys.argv[1])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    try:
        with trainscale.init(seed=0) as rt:
            Checkpointer(out / "ckpt", rt).save(attempt + 1, {"weights": torch.zeros(2)})
            if rt.rank == 1 and attempt == 0:
                raise ValueError("rank 1 fails in attempt 0")
            if rt.rank == 1 and attempt == 1:
                ctypes.string_at(0)  # SIGSEGV in the user's code
            rt.barrier()
    finally:  # the user's cleanup takes seconds (a tracker's upload): rank 1's group closed, its process goes on
        if int(os.environ["RANK"]) == 1 and attempt == 0:
            time.sleep(6)
    if rt.rank == 0:
        atexit.register(lambda: (out / f"atexit-{attempt}").write_text("ran"))
""")


@pytest.mark.slow
def test_restarts_are_announced_with_their_cause_and_a_crash_keeps_its_signal(tmp_path):
    script = tmp_path / "restarting.py"
    script.write_text(RESTARTING)
    proc = _run(
        tmp_path,
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "2",
        "--all-ranks",
        "--log-dir",
        "logs",
        str(script),
        str(tmp_path),
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    err = proc.stderr
    ckpt = tmp_path / "ckpt"
    # one line per restart: who failed, why, which attempt, where the ranks resume; the cause is rank 1's
    # error although rank 0 ended first (it lost its peer, whose process went on until the agent stopped it)
    # rank 1's exit with its error, or (on a loaded machine, its teardown slower than the agent) its stop by the
    # agent's SIGTERM while it exited: both are what happened, and both name its error
    assert re.search(
        r"trainscale: attempt 1 of 3 failed: rank 1 on \S+ \((failed, then stopped by SIGTERM while "
        r"exiting|exit code 1): ValueError: rank 1 fails in attempt 0\); restarting all ranks \(attempt 2 "
        r"of 3\), resuming from " + re.escape(f"{ckpt / 'ckpt-00000001.pt'} (step 1)"),
        err,
    ), err
    assert re.search(
        r"attempt 2 of 3 failed: rank 1 on \S+ \(killed by SIGSEGV\); restarting all ranks "
        r"\(attempt 3 of 3\), resuming from .*ckpt-00000002\.pt \(step 2\)",
        err,
    ), err
    # the summary ends with the attempts and their causes
    tail = err[err.index("rank(s) ended without training") :]  # no optimizer step: the script only checkpoints
    assert "Attempts: 3 of 3 (--max-restarts 2):" in tail and "  3: finished" in tail
    assert "  1: failed, rank 1 on" in tail and "  2: failed, rank 1 on" in tail and "SIGSEGV" in tail
    # torch's lines that these replace are gone; a traceback carries one rank prefix
    assert "closing signal" not in err and "attempts left" not in err and "failed (exitcode" not in err
    console = proc.stdout + err
    # rank 0 only lost its peer: its traceback (when the agent's stop did not come first) stays in its log, without
    # torch's own rank prefix
    assert not re.search("Connection (closed|reset) by peer", console), console  # gloo's own words
    assert "[rank0]: Traceback" not in console and "[rank0]: [rank0]:" not in console
    log = (tmp_path / "logs" / "latest" / "attempt_0" / "0" / "stderr.log").read_text()
    assert "[rank0]:" not in log and ("Traceback" not in log or "this rank lost a rank that ended first" in log), log
    # the user's atexit handler ran in the attempt that finished
    assert (tmp_path / "atexit-2").read_text() == "ran"


WAITING = textwrap.dedent("""
    import pathlib, sys
    import torch
    from torch import nn
    import trainscale

    out = pathlib.Path(sys.argv[1])
    with trainscale.init(seed=0) as rt:
        model = nn.Linear(8, 2)
        model, optimizer = rt.setup(model, torch.optim.SGD(model.parameters(), lr=0.1), strategy="ddp:comm_hook=shm")
        step = 0
        while True:  # until the launcher is stopped
            rt.backward(model(torch.randn(4, 8)).sum())
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            if step == 3:
                (out / f"training{rt.rank}").touch()
""")


def _start(tmp_path: Path, ignored: tuple[int, ...] = ()) -> tuple[subprocess.Popen, list[psutil.Process]]:
    """The launcher with two waiting ranks; ``ignored``: signals it starts with ignored (``nohup``, ``&``)."""
    script = tmp_path / "waiting.py"
    script.write_text(WAITING)

    def ignore() -> None:
        for signum in ignored:
            signal.signal(signum, signal.SIG_IGN)

    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainscale",
            "run",
            "--nproc-per-node",
            "2",
            "--log-dir",
            "logs",
            str(script),
            str(tmp_path),
        ],
        cwd=tmp_path,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ignore if ignored else None,
    )
    deadline = time.monotonic() + 180
    while not all((tmp_path / f"training{r}").exists() for r in (0, 1)):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the ranks never started training"
        time.sleep(0.1)
    workers = [
        c
        for c in psutil.Process(proc.pid).children(recursive=True)
        if "trainscale.launch.bootstrap" in " ".join(c.cmdline())
    ]
    assert len(workers) == 2
    return proc, workers


def _gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE  # dead, not yet reaped by its new parent
    except psutil.NoSuchProcess:
        return True


def _wait_gone(processes: list[psutil.Process], timeout: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in processes if not _gone(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in processes if not _gone(p)]


def _shm(workers: list[psutil.Process]) -> set[str]:
    """The shared-memory files of trainscale's gradient average that these workers have mapped (other
    tests running beside this one have their own)."""
    names = set()
    for worker in workers:
        try:
            names |= {m.path for m in worker.memory_maps() if "trainscale-shm-" in m.path}
        except psutil.Error:
            continue
    return names


@pytest.mark.slow
def test_workers_die_with_a_sigkilled_launcher(tmp_path):
    proc, workers = _start(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=30)
    left = _wait_gone(workers, timeout=10)
    for p in left:  # do not leave them training on whatever happens
        p.kill()
    assert not left, f"workers {[p.pid for p in left]} outlived their launcher"


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: signal.Signals(s).name)
def test_a_signal_to_the_launcher_stops_everything_with_one_line(tmp_path, signum):
    proc, workers = _start(tmp_path)
    mapped = _shm(workers)
    family = [psutil.Process(proc.pid), *workers]
    proc.send_signal(signum)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        for p in workers:
            if not _gone(p):
                p.kill()
    assert proc.returncode == 128 + signum, err
    lines = [line for line in err.splitlines() if not line.startswith("trainscale: set OMP_NUM_THREADS")]
    logs = next(p for p in (tmp_path / "logs").iterdir() if not p.is_symlink())  # not the "latest" link
    assert lines == [
        f"trainscale: received {signal.Signals(signum).name}: stopped the 2 rank(s) of this node; "
        f"per-rank logs in {logs}"
    ], err
    assert "Traceback" not in out + err
    assert not _wait_gone(family, timeout=10), "a process outlived the launcher"
    assert not any(
        c.status == psutil.CONN_LISTEN for c in psutil.net_connections(kind="inet") if c.pid in {p.pid for p in family}
    ), "a socket still listens"
    assert mapped and not any(Path(name).exists() for name in mapped), f"shared memory left: {mapped}"


@pytest.mark.slow
def test_a_launcher_started_under_nohup_stops_a_workloads_ranks_at_once(tmp_path):
    """issue 35 item 4: `nohup trainscale run ... &` starts with SIGHUP and SIGINT ignored. A workload's ranks
    are forked from a forkserver that inherited that before torch's agent took the signals over, and the agent
    passes the signal it gets on to them: they held the stop up 30 s, until a SIGKILL."""
    console = tmp_path / "console.txt"

    def nohup() -> None:
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    with console.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainscale",
                "run",
                "--nproc-per-node",
                "2",
                "--log-dir",
                "logs",
                "--workload",
                "cnn",
                "--data",
                "synthetic",
                "--samples",
                "200000",
                "--log-every",
                "0",
            ],
            cwd=tmp_path,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=nohup,
        )
    deadline = time.monotonic() + 180
    while "[rank0]: cnn:" not in console.read_text():  # set up and training
        assert proc.poll() is None, console.read_text()
        assert time.monotonic() < deadline, "the ranks never started training"
        time.sleep(0.1)
    workers = [c for c in psutil.Process(proc.pid).children(recursive=True) if c.name().startswith("ts-rank")]
    began = time.monotonic()
    proc.send_signal(signal.SIGHUP)  # the terminal closing (what nohup was for), or `kill -HUP`
    proc.wait(timeout=120)
    took = time.monotonic() - began
    for p in _wait_gone(workers, timeout=5):
        p.kill()
    assert proc.returncode == 128 + signal.SIGHUP and took < 15, (proc.returncode, took, console.read_text()[-2000:])
    said = [line for line in console.read_text().splitlines() if not line.startswith("[rank0]:")]
    assert [line for line in said if "OMP_NUM_THREADS" not in line] == [  # one line: torch's per rank left out
        f"trainscale: received SIGHUP: stopped the 2 rank(s) of this node; per-rank logs in "
        f"{next(p for p in (tmp_path / 'logs').iterdir() if not p.is_symlink())}"
    ], said


@pytest.mark.slow
def test_forked_workers_of_a_workload_and_their_forkserver_die_with_a_sigkilled_launcher(tmp_path):
    """A workload's ranks are forked from a forkserver (launch/local.py), not started by the agent: they
    must still die with it, and the forkserver too."""
    console = tmp_path / "console.txt"
    with console.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainscale",
                "run",
                "--nproc-per-node",
                "2",
                "--log-dir",
                "logs",
                "--workload",
                "cnn",
                "--data",
                "synthetic",
                "--samples",
                "200000",
                "--log-every",
                "0",
            ],
            cwd=tmp_path,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 180
    while "[rank0]: cnn:" not in console.read_text():  # set up and training
        assert proc.poll() is None, console.read_text()
        assert time.monotonic() < deadline, "the ranks never started training"
        time.sleep(0.1)
    workers = [c for c in psutil.Process(proc.pid).children(recursive=True) if c.name().startswith("ts-rank")]
    assert len(workers) == 2 and len({w.ppid() for w in workers}) == 1 and workers[0].ppid() != proc.pid
    forkserver = psutil.Process(workers[0].ppid())
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    left = _wait_gone([*workers, forkserver], timeout=10)
    for p in left:  # do not leave them training on whatever happens
        p.kill()
    assert not left, f"{[p.pid for p in left]} outlived their launcher"
