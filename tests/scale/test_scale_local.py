"""`trainscale run --nproc-per-node 64` on this 2-core machine: 64 real gloo ranks of the tiny course-style
script start and train; one rank is killed with SIGKILL at step 3; with --max-restarts 1 the agent restarts
the group, which resumes from the checkpoint and finishes; the run ends with its one-line summary and leaves
no process, no shared-memory file and no listening socket behind. The wall time and the peak memory of the
machine are printed (-s)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
from helpers.cli import wait_for

SCRIPT = Path(__file__).resolve().parent / "scripts" / "tiny_course.py"
RANKS, STEPS, VICTIM = 64, 8, 37


def shm_files() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("trainscale-shm-*")}


def listening(pids: set[int]) -> set[int]:
    """The TCP ports that these processes listen on."""
    ports = set()
    for pid in pids:
        try:
            ports |= {
                c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN
            }
        except psutil.Error:
            continue
    return ports


def test_64_local_ranks_train_restart_after_a_sigkill_and_clean_up(tmp_path):
    before = shm_files()
    env = {**os.environ, "TRAINSCALE_PREEMPT_CHECK_EVERY": "1", "TRAINSCALE_SAMPLE_INTERVAL": "0"}
    env.pop("OMP_NUM_THREADS", None)
    t0 = time.monotonic()
    out = open(tmp_path / "out.txt", "w")
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trainscale",
            "run",
            "--nproc-per-node",
            str(RANKS),
            "--max-restarts",
            "1",
            "--log-dir",
            str(tmp_path / "logs"),
            str(SCRIPT),
            "--steps",
            str(STEPS),
            "--checkpoints",
            str(tmp_path / "checkpoints"),
            "--hold-at",
            "3",
        ],
        cwd=tmp_path,
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    peak, ports, done = [0], set(), threading.Event()

    def pss(procs: list[psutil.Process]) -> int:  # shared pages (torch's libraries) split between their users
        total = 0
        for p in procs:
            try:
                total += p.memory_full_info().pss
            except psutil.Error:
                continue
        return total

    def watch() -> None:  # the run's processes: their memory and the sockets they listen on
        while not done.wait(2.0):
            try:
                procs = [psutil.Process(run.pid), *psutil.Process(run.pid).children(recursive=True)]
            except psutil.Error:
                continue
            peak[0] = max(peak[0], pss(procs))
            ports.update(listening({p.pid for p in procs}))

    meter = threading.Thread(target=watch, daemon=True)
    meter.start()
    try:
        held = tmp_path / "checkpoints" / "ckpt-00000003.pt"
        wait_for(lambda: held.exists() or run.poll() is not None, 900, "step 3 of 64 ranks")
        started = time.monotonic() - t0
        assert run.poll() is None, (tmp_path / "out.txt").read_text()[-3000:]
        records = sorted((tmp_path / "logs").glob(f"*/metrics/rank-{VICTIM}.jsonl"))
        victim = json.loads(records[0].read_text().splitlines()[0])["pid"]
        os.kill(victim, signal.SIGKILL)
        code = run.wait(timeout=900)
    finally:
        done.set()
        if run.poll() is None:
            run.kill()
    took = time.monotonic() - t0
    text = (tmp_path / "out.txt").read_text()
    assert code == 0, text[-5000:]
    assert "rank 0 of 64" in text and "attempt 2" in text and "resumed at step 3" in text, text[-5000:]
    assert f"finished {STEPS} steps" in text and f"trainscale: {RANKS} rank(s) finished in" in text, text[-3000:]

    left = [p for p in psutil.process_iter(["cmdline"]) if str(tmp_path) in " ".join(p.info["cmdline"] or [])]
    assert not left, [p.info["cmdline"] for p in left]
    assert shm_files() <= before, shm_files() - before
    assert ports and not ports & {
        c.laddr.port for c in psutil.net_connections("tcp") if c.status == psutil.CONN_LISTEN
    }, ports
    print(
        f"\n[scale] 64 local ranks: step 3 reached {started:.0f}s after launch; SIGKILL of rank {VICTIM}, restart, "
        f"{STEPS} steps done: {took:.0f}s in all; the run's processes used {peak[0] / 2**30:.1f} GiB at most (PSS); "
        f"listened on {len(ports)} port(s), none left"
    )
