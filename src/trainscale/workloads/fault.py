"""Deliberate faults for testing recovery: ``TRAINSCALE_FAULT=hang:rank=1:step=3`` or ``exit:rank=0:step=5``.

Read once from the environment; a no-op unless the variable is set. Only the first attempt of a
torchrun group is affected (restarted workers run clean), so recovery can be observed.
"""

from __future__ import annotations

import os
import signal
import threading

from trainscale.errors import ConfigError

VAR = "TRAINSCALE_FAULT"
KINDS = ("hang", "exit", "raise", "kill")


def _parse(spec: str) -> tuple[str, int, int]:
    kind, *fields = spec.split(":")
    values = dict(f.split("=", 1) for f in fields if "=" in f)
    if kind not in KINDS or "rank" not in values or "step" not in values:
        raise ConfigError(f"{VAR}={spec!r} is not a fault spec", hint=f"e.g. {VAR}=hang:rank=1:step=3 (kinds: {', '.join(KINDS)})")
    return kind, int(values["rank"]), int(values["step"])


_SPEC = _parse(os.environ[VAR]) if os.environ.get(VAR) else None


def maybe_inject(step: int) -> None:
    if _SPEC is None or os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    kind, rank, at = _SPEC
    if step != at or int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0"))) != rank:
        return
    if kind == "hang":
        threading.Event().wait()  # stop participating, forever
    elif kind == "exit":
        os._exit(3)
    elif kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError(f"injected fault at step {step} on rank {rank}")
