"""Run a function on N real gloo ranks (separate processes) and collect ``{rank: result}``.

The function must be importable (module level) and picklable, as must its arguments and result.
Ranks see the variables torchrun would set, so ``trainscale.init()`` inside them detects a real
torchrun-style launch and builds a real process group on loopback.

Ranks are forked from a server process that imported torch once (this process's forkserver, the one
trainscale's own workers fork from: :func:`start_forkserver`), not started as fresh interpreters that each
import torch again: the suite starts a few hundred ranks. The server starts no thread or process group,
so each rank still makes its own. A rank's output (warnings, its own prints) goes to a file of its own, shown
with the error when a rank fails, not into the suite's output.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import pickle
import queue as queue_module
import shutil
import signal
import socket
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(fn_ref, args, kwargs, rank, world_size, port, extra_env, queue, output):
    from trainscale.launch.bootstrap import FORKSERVER_BLOCKS

    fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    signal.pthread_sigmask(
        signal.SIG_UNBLOCK, FORKSERVER_BLOCKS
    )  # the forkserver blocks them; a torchrun worker does not
    os.environ.update(
        {
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "GLOO_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
        }
    )
    os.environ.update(extra_env)
    try:
        # Import the function only now, so torch (imported by its module) sees OMP_NUM_THREADS=1
        # exactly as a torchrun worker would.
        module_name, qualname = fn_ref
        fn = importlib.import_module(module_name)
        for part in qualname.split("."):
            fn = getattr(fn, part)
        # Plain pickle bytes: tensors sent through the queue as-is would travel as shared-memory
        # handles that die with this process.
        queue.put((rank, True, pickle.dumps(fn(*args, **kwargs))))
    except BaseException:  # report every failure to the parent, which raises it
        queue.put((rank, False, traceback.format_exc()))


def start_forkserver() -> None:
    """This test process's one forkserver, as trainscale's command line starts it in its own process
    (launch/local.py): trainscale's own workers of an in-process ``main([...])`` fork from it, and so do
    the ranks of :func:`run_on_ranks`. Its torch loads with OMP_NUM_THREADS=1, as a
    torchrun worker's does; each rank of theirs still sets its own thread count."""
    from trainscale.launch.local import FORKSERVER_PRELOAD
    from trainscale.launch.local import start_forkserver as start

    mp.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        start()
    finally:
        if saved is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = saved


def _context() -> mp.context.BaseContext:
    start_forkserver()  # started once, by the session (tests/conftest.py) or here
    return mp.get_context("forkserver")


def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int,
    *args: Any,
    timeout: float = 180,
    env: dict[str, str] | None = None,
    rank_env: dict[int, dict[str, str]] | None = None,
    **kwargs: Any,
) -> dict[int, Any]:
    """``rank_env``: variables for single ranks on top of ``env`` (e.g. one CUDA_VISIBLE_DEVICES each)."""
    ctx = _context()
    queue = ctx.Queue()
    port = _free_port()
    outputs = Path(tempfile.mkdtemp(prefix="ranks-"))
    procs = [
        ctx.Process(
            target=_child,
            args=(
                (fn.__module__, fn.__qualname__),
                args,
                kwargs,
                r,
                world_size,
                port,
                {**(env or {}), **(rank_env or {}).get(r, {})},
                queue,
                str(outputs / f"rank-{r}.log"),
            ),
        )
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    timed_out = False
    try:
        for _ in range(world_size):
            try:
                rank, ok, value = queue.get(timeout=timeout)
            except queue_module.Empty:
                timed_out = True
                break
            if ok:
                results[rank] = pickle.loads(value)
            else:
                errors[rank] = value
            if errors:
                break
    finally:
        for p in procs:
            p.join(timeout=2 if errors or timed_out else 30)
            if p.is_alive():
                p.kill()
                p.join()
        printed = {
            r: (outputs / f"rank-{r}.log").read_text(errors="replace") if (outputs / f"rank-{r}.log").exists() else ""
            for r in range(world_size)
        }
        shutil.rmtree(outputs, ignore_errors=True)
    if timed_out:
        tails = "".join(f"\n--- rank {r}'s output (tail)\n{printed[r][-1500:]}" for r in range(world_size))
        raise TimeoutError(f"{world_size - len(results)} rank(s) gave no result within {timeout}s{tails}")
    if errors:
        rank, text = sorted(errors.items())[0]
        raise RuntimeError(f"rank {rank} failed:\n{text}\n--- rank {rank}'s output (tail)\n{printed[rank][-3000:]}")
    return results
