"""Run a function on N real gloo ranks (separate processes) and collect ``{rank: result}``.

The function must be importable (module level) and picklable, as must its arguments and result.
Ranks see the variables torchrun would set, so ``trainscale.init()`` inside them detects a real
torchrun-style launch and builds a real process group on loopback.

Ranks are forked from a server process that imported torch once (multiprocessing's forkserver, with
OMP_NUM_THREADS=1 as a torchrun worker has it), not started as fresh interpreters that each import torch
again: the suite starts a few hundred ranks. Only torch's own modules are imported there (no trainscale),
and the server starts no thread or process group, so each rank still makes its own.
"""

from __future__ import annotations

import multiprocessing as mp
import importlib
import os
import pickle
import socket
import traceback
from typing import Any, Callable


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(fn_ref, args, kwargs, rank, world_size, port, extra_env, queue):
    os.environ.update({
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port), "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1",
    })
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


def _context() -> mp.context.BaseContext:
    from multiprocessing import forkserver

    ctx = mp.get_context("forkserver")
    # torch._dynamo: torch's Optimizer imports it on first use (a second import of torch's size, per rank)
    ctx.set_forkserver_preload(["torch", "torch.distributed", "torch._dynamo", "torch.distributed.checkpoint"])
    saved = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"  # what the server's torch reads as it loads (the ranks inherit it)
    try:
        forkserver.ensure_running()
    finally:
        if saved is None:
            del os.environ["OMP_NUM_THREADS"]
        else:
            os.environ["OMP_NUM_THREADS"] = saved
    return ctx


def run_on_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout: float = 180,
                 env: dict[str, str] | None = None, rank_env: dict[int, dict[str, str]] | None = None,
                 **kwargs: Any) -> dict[int, Any]:
    """``rank_env``: variables for single ranks on top of ``env`` (e.g. one CUDA_VISIBLE_DEVICES each)."""
    ctx = _context()
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_child, args=((fn.__module__, fn.__qualname__), args, kwargs, r, world_size, port,
                                              {**(env or {}), **(rank_env or {}).get(r, {})}, queue))
             for r in range(world_size)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, str] = {}
    try:
        for _ in range(world_size):
            rank, ok, value = queue.get(timeout=timeout)
            if ok:
                results[rank] = pickle.loads(value)
            else:
                errors[rank] = value
            if errors:
                break
    finally:
        for p in procs:
            p.join(timeout=30 if not errors else 2)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        rank, text = sorted(errors.items())[0]
        raise RuntimeError(f"rank {rank} failed:\n{text}")
    return results
