"""What each worker runs first: give it a consistent world, bind its CPUs, then run the user's
script, module or program, recording its error.

Every worker, whoever started it (torchrun's agent, `trainscale run`, one srun task per rank), gets
the same variables, set from the one launch environment trainscale detects (docs/launch.md):

    RANK LOCAL_RANK WORLD_SIZE LOCAL_WORLD_SIZE GROUP_RANK NODE_RANK MASTER_ADDR MASTER_PORT
    SLURM_PROCID SLURM_LOCALID SLURM_NODEID SLURM_NTASKS ...   (agreeing with RANK & co., see below)

so a torchrun-style script (reads RANK/LOCAL_RANK) and a SLURM-style script (reads SLURM_PROCID/
SLURM_LOCALID/NODE_RANK, seed 004) both see their own, distinct rank in either launch mode.

Like torchelastic's ``@record``, a failure writes the worker's traceback to TORCHELASTIC_ERROR_FILE
in the agent's JSON format, so a failure summary shows it without the user decorating main().

Standard library only (trainscale.env and trainscale.topology are too): a stock container without
trainscale runs this module from the job kit (launch/kit.py), and it never imports torch itself.
"""

from __future__ import annotations

import faulthandler
import gc
import json
import os
import runpy
import sys
import time
import traceback
from typing import Mapping, MutableMapping

BIND_VAR = "TRAINSCALE_CPU_BIND"
"""The binding plan from the launcher; format in trainscale/topology/worker.py."""
ERROR_DIR_VAR = "TRAINSCALE_ERROR_DIR"
"""Directory for per-rank error files when no elastic agent sets TORCHELASTIC_ERROR_FILE (srun tasks)."""
TASK_GPU_VAR = "TRAINSCALE_TASK_GPU"
"""srun mode: the visibility variable (CUDA_VISIBLE_DEVICES or ROCR_VISIBLE_DEVICES) narrowed to this
task's own GPU, so a script using ``cuda``/``cuda:0`` is right on every rank."""
KIT_VAR = "TRAINSCALE_KIT"
"""Set by the kit's boot.py: the directory this module was imported from (removed before user code)."""
SNAPSHOT_VAR, SNAPSHOT_OF_VAR = "TRAINSCALE_SNAPSHOT", "TRAINSCALE_SNAPSHOT_OF"
"""A submitted job's copy of its code, and the directory it was copied from (launch/slurm/snapshot.py)."""

# SLURM's task variables as torchrun's workers should see them: each agrees with RANK & co.
_SLURM_FROM_WORLD = (
    ("SLURM_PROCID", "rank"), ("SLURM_LOCALID", "local_rank"), ("SLURM_NODEID", "node_rank"),
    ("SLURM_NTASKS", "world_size"), ("SLURM_NPROCS", "world_size"), ("SLURM_STEP_NUM_TASKS", "world_size"),
    ("SLURM_NTASKS_PER_NODE", "local_world_size"), ("SLURM_NNODES", "num_nodes"),
    ("SLURM_STEP_NUM_NODES", "num_nodes"),
)


def world_env(env, *, rewrite_slurm: bool) -> dict[str, str]:
    """The variables a worker gets from its LaunchEnv ``env`` (trainscale.env.LaunchEnv).

    ``rewrite_slurm``: the worker was started by torchrun's agent, so SLURM's task variables it
    inherited describe the agent's task (one per node), not this worker: replace them with values that
    agree with its rank (SLURM_NODEID becomes the node's rank in the job as torchrun numbered it).
    """
    out = {
        "RANK": str(env.rank), "LOCAL_RANK": str(env.local_rank), "WORLD_SIZE": str(env.world_size),
        "LOCAL_WORLD_SIZE": str(env.local_world_size), "GROUP_RANK": str(env.node_rank),
        "NODE_RANK": str(env.node_rank), "MASTER_ADDR": str(env.master_addr or "127.0.0.1"),
    }
    if env.master_port:
        out["MASTER_PORT"] = str(env.master_port)
    if rewrite_slurm:
        out.update({name: str(getattr(env, field)) for name, field in _SLURM_FROM_WORLD})
        per_node = f"{env.local_world_size}(x{env.num_nodes})" if env.num_nodes > 1 else str(env.local_world_size)
        out["SLURM_TASKS_PER_NODE"] = out["SLURM_STEP_TASKS_PER_NODE"] = per_node
    return out


def export_world_env(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set :func:`world_env` in this worker (torchrun's agent or srun started it; else nothing)."""
    from trainscale.env import detect

    env = detect(environ)
    if env.source not in ("torchrun", "slurm"):
        return
    environ.update(world_env(env, rewrite_slurm=env.source == "torchrun"))


def task_gpu(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """srun mode with TRAINSCALE_TASK_GPU=VAR: (VAR, this task's GPU) — the local rank's entry of the
    GPUs SLURM made visible (all of the node's when VAR is unset). None when not asked or not possible."""
    var = environ.get(TASK_GPU_VAR, "").strip()
    local = environ.get("SLURM_LOCALID")
    if not var or local is None or not local.isdigit():
        return None
    visible = [v for v in environ.get(var, "").split(",") if v.strip()]
    if not visible:
        return var, local
    if int(local) < len(visible):
        return var, visible[int(local)].strip()
    return None  # fewer GPUs than tasks on this node: leave them all visible (lint says so)


def narrow_gpu(environ: MutableMapping[str, str] = os.environ) -> None:
    chosen = task_gpu(environ)
    if chosen is not None:
        environ[chosen[0]] = chosen[1]


def apply_bind_from_env(environ: Mapping[str, str] = os.environ) -> None:
    """Bind this worker to its CPUs when the launcher handed down a plan (torchrun cannot bind)."""
    if not environ.get(BIND_VAR):
        return
    from trainscale.topology import bind_worker

    local_rank = int(environ.get("LOCAL_RANK", environ.get("SLURM_LOCALID", "0")))
    local_world = int(environ.get("LOCAL_WORLD_SIZE", environ.get("SLURM_NTASKS_PER_NODE", "1")))
    report = bind_worker(local_rank, local_world)
    if local_rank == 0 or report.far:
        print(f"trainscale: {report.describe()}", file=sys.stderr, flush=True)


def set_error_file(environ: MutableMapping[str, str] = os.environ) -> None:
    """Point @record at ``<dir>/error-rank<R>.json`` so every srun task leaves its traceback in the job dir."""
    directory = environ.get(ERROR_DIR_VAR)
    if not directory or environ.get("TORCHELASTIC_ERROR_FILE"):
        return
    rank = environ.get("RANK") or environ.get("SLURM_PROCID") or environ.get("PMI_RANK") or "0"
    environ["TORCHELASTIC_ERROR_FILE"] = os.path.join(directory, f"error-rank{rank}.json")


_STARTED = time.time()


def record_exception(exc: BaseException, environ: Mapping[str, str] = os.environ) -> None:
    """torchelastic's error-file format: {"message": {"message", "extraInfo": {"py_callstack", "timestamp"}}}.

    A file written during this run is the script's own ``@record`` (closer to the error): kept."""
    path = environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    try:
        if os.path.getmtime(path) >= _STARTED - 1:
            return
    except OSError:
        pass
    data = {"message": {"message": f"{type(exc).__name__}: {exc}",
                        "extraInfo": {"py_callstack": traceback.format_exc(), "timestamp": str(int(time.time()))}}}
    try:
        with open(path, "w") as fh:
            json.dump(data, fh)
    except OSError as err:  # never hide the real error behind this one
        print(f"trainscale: could not write the error file {path}: {err}", file=sys.stderr)


def record(fn):
    def wrapper(argv: list[str]) -> None:
        faulthandler.enable(all_threads=True)  # a segfault still leaves Python stacks on stderr
        try:
            fn(argv)
        except SystemExit as exc:
            if exc.code not in (None, 0):
                record_exception(exc)
            raise
        except BaseException as exc:
            record_exception(exc)
            raise

    return wrapper


USAGE = "usage: bootstrap (--script PATH | --module NAME | --exec PROGRAM) [ARGS...]"


def main(argv: list[str]) -> None:
    set_error_file()  # first: @record writes there if anything below fails
    _main(argv)


@record
def _main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] not in ("--script", "--module", "--exec"):
        raise SystemExit(USAGE)
    kind, target, args = argv[0], argv[1], argv[2:]
    # Before the user's code reads them (torch reads *_VISIBLE_DEVICES when CUDA is first touched).
    export_world_env()
    narrow_gpu()
    apply_bind_from_env()
    leave_kit()
    enter_snapshot()
    if kind == "--exec":  # a program, not Python (torchrun's --no-python): it inherits the world above
        sys.stdout.flush()
        os.execvp(target, [target, *args])
    sys.argv = [target, *args]
    if kind == "--module":
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")
    release_process_groups()


def leave_kit(environ: MutableMapping[str, str] = os.environ) -> None:
    """Started from the job kit (a stock container): forget the kit's copy of trainscale before the
    user's code runs, so ``import trainscale`` there finds the image's own one (or fails by name)."""
    kit = environ.pop(KIT_VAR, None)
    if not kit:
        return
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != kit]
    for name, module in list(sys.modules.items()):
        if (name == "trainscale" or name.startswith("trainscale.")) and \
                os.path.abspath(getattr(module, "__file__", None) or "").startswith(kit + os.sep):
            del sys.modules[name]


def enter_snapshot(environ: MutableMapping[str, str] = os.environ) -> None:
    """A submitted job runs a snapshot of its code: every import path inside the original directory (the
    working directory, PYTHONPATH, an editable install's path) is pointed at its copy where the copy has
    it, so the job imports the code as it was at submission, as ``trainscale run`` would have found it."""
    copy, root = environ.get(SNAPSHOT_VAR), environ.get(SNAPSHOT_OF_VAR)
    if not copy or not root:
        return

    def mapped(entry: str) -> str:
        path = os.path.abspath(entry or ".")
        if path == root or path.startswith(root + os.sep):
            candidate = copy + path[len(root):]
            if os.path.exists(candidate):
                return candidate
        return entry

    sys.path[:] = [mapped(p) for p in sys.path]
    if environ.get("PYTHONPATH"):  # DataLoader workers and other children start from it
        environ["PYTHONPATH"] = os.pathsep.join(mapped(p) for p in environ["PYTHONPATH"].split(os.pathsep))


def release_process_groups() -> None:
    """After a clean run, let torch.distributed wind down while the interpreter is still whole.

    A gloo worker thread drops each finished collective after the caller has moved on; when that
    collective holds tensors created in Python the drop needs the GIL. Asked for during interpreter
    shutdown, the GIL ends the thread with ``pthread_exit`` inside C++ code and the rank dies with
    "terminate called without an active exception" (SIGABRT) after training succeeded. A full
    collection here frees models in reference cycles (so a destroyed group can really go, joining
    its threads) and outlasts the interpreter's switch interval, so a worker already waiting for the
    GIL gets it before shutdown. A group the script left initialised is destroyed. Not done after
    an error: destroying a group whose peers are gone can wait out the collective timeout.
    """
    gc.collect()
    dist = sys.modules.get("torch.distributed")  # never import torch just for this
    if dist is not None and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        gc.collect()


if __name__ == "__main__":
    main(sys.argv[1:])
