"""Deliberate faults for testing recovery: ``TRAINSCALE_FAULT=hang:rank=1:step=3`` or ``exit:rank=0:step=5``.

A no-op unless the variable is set. Only the first attempt of a torchrun group is affected (restarted
workers run clean), so recovery can be observed. The rank and the restart count are the launch's own
(``LaunchEnv``): under mpirun there is no RANK variable, and every process used to take itself for rank 0.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Mapping

from trainscale.env import LaunchEnv
from trainscale.errors import ConfigError

VAR = "TRAINSCALE_FAULT"
KINDS = ("hang", "exit", "raise", "kill")


def planned(environ: Mapping[str, str] | None = None) -> tuple[str, int, int] | None:
    """(kind, rank, step) from TRAINSCALE_FAULT (a test hook, not a launch fact), or None."""
    spec = (os.environ if environ is None else environ).get(VAR)
    if not spec:
        return None
    kind, *fields = spec.split(":")
    values = dict(f.split("=", 1) for f in fields if "=" in f)
    if kind not in KINDS or "rank" not in values or "step" not in values:
        raise ConfigError(
            f"{VAR}={spec!r} is not a fault spec", hint=f"e.g. {VAR}=hang:rank=1:step=3 (kinds: {', '.join(KINDS)})"
        )
    return kind, int(values["rank"]), int(values["step"])


def maybe_inject(step: int, env: LaunchEnv, fault: tuple[str, int, int] | None) -> None:
    if fault is None or env.restart_count:
        return
    kind, rank, at = fault
    if step != at or env.rank != rank:
        return
    if kind == "hang":
        threading.Event().wait()  # stop participating, forever
    elif kind == "exit":
        os._exit(3)
    elif kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"injected fault at step {step} on rank {rank}")
