"""What each worker runs first: apply its CPU set, then the user's script or module, recording its error.

Like torchelastic's ``@record``, a failure writes the worker's traceback to TORCHELASTIC_ERROR_FILE
(set per rank by the elastic agent) in the agent's JSON format, so a failure summary can show it
without the user decorating their own main(). Written here without importing torch, so the worker
starts as fast as the script itself allows.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import runpy
import sys

import json
import time
import traceback

BIND_VAR = "TRAINSCALE_CPU_BIND"
"""The binding plan from the launcher; format in trainscale/topology/worker.py."""


def apply_bind_from_env() -> None:
    """Bind this worker to its CPUs when the launcher handed down a plan (torchrun cannot bind)."""
    if not os.environ.get(BIND_VAR):
        return
    from trainscale.topology import bind_worker

    local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("SLURM_NTASKS_PER_NODE", "1")))
    report = bind_worker(local_rank, local_world)
    if local_rank == 0 or report.far:
        print(f"trainscale: {report.describe()}", file=sys.stderr, flush=True)


EXPORT_TORCHRUN_VAR = "TRAINSCALE_EXPORT_TORCHRUN_ENV"
"""Set to 1 (by `trainscale slurm --launcher srun`) so scripts that read only torchrun's variables work."""
ERROR_DIR_VAR = "TRAINSCALE_ERROR_DIR"
"""Directory for per-rank error files when no elastic agent sets TORCHELASTIC_ERROR_FILE (srun tasks)."""


def export_torchrun_env(environ=os.environ) -> None:
    """In an srun task, export RANK, LOCAL_RANK, WORLD_SIZE... as torchrun would (same values as detected)."""
    if environ.get(EXPORT_TORCHRUN_VAR) != "1":
        return
    from trainscale.env import detect

    env = detect(environ)
    if env.source != "slurm":
        return
    environ.update({
        "RANK": str(env.rank), "LOCAL_RANK": str(env.local_rank), "WORLD_SIZE": str(env.world_size),
        "LOCAL_WORLD_SIZE": str(env.local_world_size), "GROUP_RANK": str(env.node_rank),
        "MASTER_ADDR": str(env.master_addr or "127.0.0.1"), "MASTER_PORT": str(env.master_port or ""),
    })


def set_error_file(environ=os.environ) -> None:
    """Point @record at ``<dir>/error-rank<R>.json`` so every srun task leaves its traceback in the job dir."""
    directory = environ.get(ERROR_DIR_VAR)
    if not directory or environ.get("TORCHELASTIC_ERROR_FILE"):
        return
    rank = environ.get("RANK") or environ.get("SLURM_PROCID") or environ.get("PMI_RANK") or "0"
    environ["TORCHELASTIC_ERROR_FILE"] = os.path.join(directory, f"error-rank{rank}.json")


def main(argv: list[str]) -> None:
    # Before @record reads TORCHELASTIC_ERROR_FILE (it does so when the exception is recorded).
    export_torchrun_env()
    set_error_file()
    _main(argv)


def record_exception(exc: BaseException, environ=os.environ) -> None:
    """torchelastic's error-file format: {"message": {"message", "extraInfo": {"py_callstack", "timestamp"}}}."""
    path = environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
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


@record
def _main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] not in ("--script", "--module"):
        raise SystemExit("usage: python -m trainscale.launch.bootstrap (--script PATH | --module NAME) [ARGS...]")
    kind, target, args = argv[0], argv[1], argv[2:]
    apply_bind_from_env()
    sys.argv = [target, *args]
    if kind == "--module":
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")
    release_process_groups()


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
