"""Where am I? Detect the launch environment from os.environ; nothing here changes anything."""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable, Mapping

from trainscale.env import mpi, single, slurm, torchrun
from trainscale.env.base import LaunchEnv, job_facts
from trainscale.errors import ConfigError, did_you_mean

OVERRIDE_VAR = "TRAINSCALE_LAUNCHER"
"""Set to torchrun, slurm, mpi or single to force one detector (for example an MPI job inside SLURM)."""

# Order decides who wins when several launchers' variables are present:
DETECTORS: tuple[tuple[str, Callable[[Mapping[str, str]], LaunchEnv | None]], ...] = (
    # torchrun first: it runs inside SLURM allocations and MPI jobs, and it is the one that
    # actually started this worker, so its RANK/LOCAL_RANK are the true ones.
    (torchrun.NAME, torchrun.detect),
    # srun tasks next: SLURM also exports PMI_* variables for its PMI plugins, so SLURM must beat MPI.
    (slurm.NAME, slurm.detect),
    # mpirun outside SLURM.
    (mpi.NAME, mpi.detect),
    # nothing matched: one process.
    (single.NAME, single.detect),
)


def detect(environ: Mapping[str, str] | None = None) -> LaunchEnv:
    """The launch environment of this process (pass ``environ`` to inspect another one)."""
    environ = os.environ if environ is None else environ
    return dataclasses.replace(_launcher(environ), **job_facts(environ))


def node_name(environ: Mapping[str, str] | None = None) -> str:
    """This node's name: SLURM's own (SLURMD_NODENAME: two nodes may share a hostname), else the hostname."""
    return (os.environ if environ is None else environ).get("SLURMD_NODENAME") or socket.gethostname()


def _launcher(environ: Mapping[str, str]) -> LaunchEnv:
    forced = environ.get(OVERRIDE_VAR, "").strip().lower()
    if forced:
        names = [name for name, _ in DETECTORS]
        if forced not in names:
            raise ConfigError(f"{OVERRIDE_VAR}={forced!r} is not a launcher", hint=did_you_mean(forced, names))
        found = dict(DETECTORS)[forced](environ)
        if found is None:
            raise ConfigError(
                f"{OVERRIDE_VAR}={forced} but the {forced} variables are not set in this process",
                hint=f"unset {OVERRIDE_VAR} to detect the launcher automatically",
            )
        return found
    for _, detector in DETECTORS:
        found = detector(environ)
        if found is not None:
            return found
    raise AssertionError("single.detect always matches")  # pragma: no cover


__all__ = ["LaunchEnv", "detect", "node_name", "DETECTORS", "OVERRIDE_VAR"]
