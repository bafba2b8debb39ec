"""One run per checkpoint directory: rank 0 of a run holds an exclusive lock on ``<dir>/.trainscale.lock`` for as
long as its Checkpointer lives. A second run on the same directory — a requeued job while the old one still
runs, a command pasted twice — is refused in one line naming the holder, instead of the two pruning each
other's half-written files and resuming from each other's checkpoints.

The lock is the kernel's (``flock``): released when the holder's process ends, however it ends (a SIGKILL, a
lost node's processes), so a dead holder never blocks the next run. The file says who holds it (pid, host, run
directory, since when), for the refusal's words; it stays, empty, after the run (removing a lock file races
the next run's open of it). On a file system without ``flock`` the file alone decides: a
holder on this host whose process is gone is stale; one on another host is taken at its word, with a warning.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path

log = logging.getLogger("trainscale.checkpoint")

LOCK = ".trainscale.lock"
_HELD: dict[str, tuple[int, int]] = {}
"""Directories this process holds: path -> (fd, how many Checkpointers share it)."""


def _describe(holder: dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder["since"])) if holder.get("since") else "?"
    run = f", run directory {holder['run_dir']}" if holder.get("run_dir") else ""
    return f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}{run}, since {since}"


def _holder(path: Path) -> dict:
    with contextlib.suppress(OSError, ValueError):
        return json.loads(path.read_text() or "{}")
    return {}


def acquire(directory: Path, run_dir: str | None = None) -> str | None:
    """Take ``directory``'s lock for this process; None when taken, else the holder's description."""
    key = str(Path(directory).resolve())
    if key in _HELD:
        fd, count = _HELD[key]
        _HELD[key] = (fd, count + 1)
        return None
    Path(directory).mkdir(parents=True, exist_ok=True)
    path = Path(directory) / LOCK
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return _describe(_holder(path))
    except OSError as exc:  # no flock on this file system: the file's word
        holder = _holder(path)
        if holder and _alive(holder) and holder.get("pid") != os.getpid():
            os.close(fd)
            return _describe(holder)
        log.warning(
            "%s: this file system cannot lock files (%s): another run on this directory would not be refused",
            directory,
            exc,
        )
    me = {"pid": os.getpid(), "host": socket.gethostname(), "run_dir": run_dir, "since": time.time()}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(me).encode(), 0)
    _HELD[key] = (fd, 1)
    return None


def release(directory: Path) -> None:
    key = str(Path(directory).resolve())
    if key not in _HELD:
        return
    fd, count = _HELD[key]
    if count > 1:
        _HELD[key] = (fd, count - 1)
        return
    del _HELD[key]
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def _alive(holder: dict) -> bool:
    """A holder on this host is alive while its process is; one elsewhere cannot be checked from here."""
    if holder.get("host") != socket.gethostname():
        return True
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
