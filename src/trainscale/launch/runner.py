"""Run a pickled call ``fn(*args, **kwargs)`` on every rank, inside the normal launch.

``trainscale.launch(fn, ...)`` (launch/function.py) and ``trainscale.slurm.submit(fn, ...)``
(launch/slurm/api.py) write the call into a directory and start

    python -m trainscale.launch.bootstrap --module trainscale.launch.runner DIR

on every rank, exactly as they would start a script: the same ranks, rendezvous, CPU binding, logs and
failure summary. Each rank leaves in DIR:

    call.pkl                 the call (written by the submitter)
    result-rank<R>.pkl       rank R's return value
    error-rank<R>.pkl        rank R's exception: its rank, host, traceback (and the exception itself when it pickles)
    job.json                 rank 0: the SLURM job and its job directory (an array task's logs are found by it)

The call is pickled with cloudpickle (by reference or by value: docs/ecosystem.md). Unpickling runs
code: these files are for your own code only, as any pickle (docs/security.md).
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import cloudpickle

from trainscale.env import detect, node_name
from trainscale.errors import ALSO_RECORD, ConfigError, RankFailed
from trainscale.launch.bootstrap import enter_snapshot
from trainscale.launch.summary import lost_peer

CALL = "call.pkl"


def result_path(directory: Path, rank: int) -> Path:
    return Path(directory) / f"result-rank{rank}.pkl"


def error_path(directory: Path, rank: int) -> Path:
    return Path(directory) / f"error-rank{rank}.pkl"


def _write(path: Path, data: bytes) -> None:
    """Atomic: a reader never sees half a pickle (temp file, then rename)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_call(directory: Path, fn: Callable[..., Any], args: tuple, kwargs: dict | None = None) -> Path:
    """Pickle the call, with this process's import path (a notebook's ``sys.path.append``) and working directory."""
    if not callable(fn):
        raise ConfigError(
            f"{fn!r} is not a function", hint="pass the function itself, e.g. launch(train, 1e-3), not train(1e-3)"
        )
    payload = {
        "fn": fn,
        "args": tuple(args),
        "kwargs": dict(kwargs or {}),
        "sys_path": list(sys.path),
        "cwd": os.getcwd(),
    }
    directory.mkdir(parents=True, exist_ok=True)
    path = Path(directory) / CALL
    _write(path, cloudpickle.dumps(payload))
    return path


def read_results(directory: Path, world_size: int) -> list[Any]:
    """Every rank's return value, indexed by rank."""
    return [pickle.loads(result_path(directory, rank).read_bytes()) for rank in range(world_size)]


def read_failures(directory: Path) -> list[dict[str, Any]]:
    """The ranks' own recorded exceptions, earliest first. A rank's report that a peer's end closed its
    connection is left out: it is never the cause (a SIGKILLed rank records nothing; the launcher names it)."""
    found = []
    for path in Path(directory).glob("error-rank*.pkl"):
        try:
            record = pickle.loads(path.read_bytes())
        except Exception:  # a record that cannot be read (a class gone since) still names its rank in its name
            record = {"rank": int(path.stem.removeprefix("error-rank")), "traceback": "", "exception": None}
        record["when"] = path.stat().st_mtime
        if not lost_peer(record["traceback"]):
            found.append(record)
    return sorted(found, key=lambda r: (r["when"], r["rank"]))


def failure(records: list[dict[str, Any]], summary: str, what: str):
    """The first rank's recorded exception as a RankFailed (chained to the exception itself), or the
    launcher's summary when no rank recorded one (killed by a signal, out of memory)."""
    if not records:
        return RankFailed(
            f"{what} failed before any rank recorded an exception:\n{summary.strip()}", rank=None, traceback=summary
        )
    first = records[0]
    error = RankFailed(
        f"{what} failed on rank {first['rank']}"
        + (f" ({first['host']})" if first.get("host") else "")
        + f":\n{first['traceback'].rstrip()}",
        rank=first["rank"],
        traceback=first["traceback"],
    )
    if isinstance(first.get("exception"), BaseException):
        error.__cause__ = first["exception"]
    return error


def main(argv: list[str]) -> None:
    if len(argv) != 1:
        raise SystemExit("usage: python -m trainscale.launch.runner DIR (DIR holds call.pkl)")

    directory = Path(argv[0])
    rank = detect().rank
    error_path(directory, rank).unlink(missing_ok=True)  # a restarted or requeued attempt starts clean
    payload = pickle.loads((directory / CALL).read_bytes())
    # the submitter's import path, after the worker's own; a submitted job's entries point at its snapshot
    sys.path += [entry for entry in dict.fromkeys(payload["sys_path"]) if entry and entry not in sys.path]
    enter_snapshot()
    if rank == 0 and os.environ.get("SLURM_JOB_ID"):
        job = {"job_id": os.environ["SLURM_JOB_ID"], "job_dir": os.environ.get("TRAINSCALE_JOB_DIR")}
        _write(directory / "job.json", json.dumps(job).encode())

    def keep(exc: BaseException) -> None:
        stack = "".join(traceback.format_exception(exc))
        record = {"rank": rank, "host": node_name(), "traceback": stack, "exception": exc}
        try:
            data = cloudpickle.dumps(record)
        except Exception:  # an exception that does not pickle: its traceback still does
            data = cloudpickle.dumps({**record, "exception": None})
        _write(error_path(directory, rank), data)

    # trainscale.init()'s block records a rank's error before it closes the group, when its peers fail and the
    # launcher may stop this rank before the exception reaches the except below: keep it then too
    ALSO_RECORD.append(keep)
    try:
        result = payload["fn"](*payload["args"], **payload["kwargs"])
    except BaseException as exc:
        if isinstance(exc, SystemExit) and exc.code in (None, 0):
            result = None
        else:
            keep(exc)  # with the whole stack, now that it has unwound
            raise
    _write(result_path(directory, rank), cloudpickle.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
