"""NCCL-specific settings made before the process group exists: flight recorder, watchdog timeout,
eager initialisation, and the one NCCL error trainscale can explain better than NCCL does."""

from __future__ import annotations

import datetime
import os
import re
import tempfile
from collections.abc import MutableMapping

from trainscale.errors import LaunchError

NCCL_BACKSTOP_S = 30.0
"""How long NCCL's own watchdog waits beyond the collective timeout (see :func:`watchdog_timeout`)."""

DUMP_FILE_VARS = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
"""Where the flight recorder dumps, newest name first: torch >= 2.7 reads both, older torch only the
second, so both are set (to the user's value when they set either)."""


def watchdog_timeout(timeout: datetime.timedelta) -> datetime.timedelta:
    """NCCL's watchdog timeout for a job whose collective timeout is ``timeout``: that plus
    ``NCCL_BACKSTOP_S``. The hang watch (runtime/hangwatch/watch.py) times a stuck collective from when it was
    queued, as NCCL does (its flight record's age), so it names the hung rank first and ends the process;
    NCCL's watchdog, which can only abort, is the backstop where nothing watches or nobody is to blame
    (docs/gpu.md, "Hangs"). It once waited a whole timeout more, every GPU of a hung job idle twice as long."""
    return timeout + datetime.timedelta(seconds=NCCL_BACKSTOP_S)


def enable_flight_recorder(environ: MutableMapping[str, str] | None = None, job_dir: str | None = None) -> str:
    """Keep a per-rank trace of recent collectives and dump it when one times out; returns the dump
    file prefix. Must run before the NCCL process group is created; a user's own settings win.
    ``job_dir``: the job's directory (``LaunchEnv.job_dir``), where the traces go by default.

    ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` is left to torch's default: trainscale names a hung rank
    itself (runtime/hangwatch/heartbeat.py), so it has no reason to change how NCCL tears down after an error.
    """
    environ = os.environ if environ is None else environ
    from trainscale.runtime.hangwatch import ledger  # noqa: PLC0415 (torch-free module)

    ledger.enable_flight_recorder(environ)  # torch's documented size, under one name; the user's wins
    environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    given = next((environ[name] for name in DUMP_FILE_VARS if environ.get(name)), None)
    if given is None:
        default = (
            os.path.join(job_dir, "nccl-traces")
            if job_dir
            else os.path.join(tempfile.gettempdir(), f"trainscale-nccl-traces-{os.getuid()}")
        )
        dump_dir = environ.get("TRAINSCALE_TRACE_DIR", default)
        os.makedirs(dump_dir, exist_ok=True)
        given = os.path.join(dump_dir, "nccl_trace_rank_")
    for name in DUMP_FILE_VARS:
        environ.setdefault(name, given)
    return given


def eager_init_is_safe(torch_version: str) -> bool:
    """Whether ``init_process_group(device_id=...)`` (eager NCCL init bound to this GPU) is safe.

    torch 2.6.0 - 2.7.0 can hang in later collectives with it (pytorch/pytorch#153960; DeepSpeed
    skips it for the same versions); without it NCCL initialises lazily on the first collective.
    """
    match = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", torch_version)
    if match is None:
        return True
    version = tuple(int(part or 0) for part in match.groups())
    return not ((2, 6, 0) <= version < (2, 7, 1))


def explain_init_error(error: BaseException) -> LaunchError | None:
    """NCCL refuses two ranks on one GPU only at communicator creation, with a bare message."""
    line = next((line for line in str(error).splitlines() if "Duplicate GPU detected" in line), None)
    if line is None:
        return None
    return LaunchError(
        f"two ranks of this job use the same GPU (NCCL: {line.strip()[:200]})",
        hint="give every rank its own GPU: one rank per visible GPU (`--nproc-per-node gpu`), no shared "
        "CUDA_VISIBLE_DEVICES value across ranks, or SLURM --gpus-per-task=1",
    )


TRANSPORT_DEBUG_VARS = {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
EXPECTED_NETWORK_VAR = "TRAINSCALE_INTERCONNECT"
"""The network the cluster's profile expects (ofi, ib, socket), exported by the batch script."""


def transport_log(environ: MutableMapping[str, str], log_dir: str | os.PathLike) -> str | None:
    """Before NCCL starts: make it write its INIT/NET lines (which network it picked) to a file of this
    process, never to the console, unless the user set NCCL_DEBUG themselves. Returns the file, or None.
    observe/interconnect.py reads it."""
    if environ.get("NCCL_DEBUG") or environ.get("NCCL_DEBUG_FILE"):
        return None
    os.makedirs(log_dir, exist_ok=True)
    path = os.path.join(log_dir, f"nccl-{os.getpid()}.log")
    environ.update({**TRANSPORT_DEBUG_VARS, "NCCL_DEBUG_FILE": path})
    return path
