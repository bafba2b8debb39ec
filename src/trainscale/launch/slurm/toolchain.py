"""What the job's shell loads and which Python it runs (pure; the probe in probe.py checks it).

The module lines and the Python, as a hand-written batch script would pick them: docs/slurm.md, "Site
environment" and "Which Python the job runs". A Python found at job time (python3 after modules or in an
image) may not have trainscale, so such a job takes trainscale's worker side from the job kit (launch/kit.py).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

from trainscale.launch.slurm.spec import SlurmJobSpec
from trainscale.profiles.schema import ClusterProfile


def profile_module_lines(spec: SlurmJobSpec, profile: ClusterProfile) -> tuple[str, ...]:
    """The profile's lines this job loads (before its own)."""
    if not spec.profile_modules:
        return ()
    if spec.container and profile.container is not None and profile.container.modules is not None:
        return profile.container.modules
    return profile.modules


def module_lines(spec: SlurmJobSpec, profile: ClusterProfile) -> tuple[str, ...]:
    """Every module line of the job, in order, each starting with ``module``."""
    own = tuple(m if m.startswith("module ") else f"module {m}" for m in spec.modules)
    return profile_module_lines(spec, profile) + own


@dataclass(frozen=True)
class JobPython:
    command: str
    """What the batch script runs: a path, or a name looked up on the job's PATH."""
    kit: bool
    """True: trainscale's worker side comes from the job kit (this Python may not have trainscale)."""
    source: str
    """Why this one: ``--python``, ``container``, ``modules`` or ``this interpreter``."""

    @property
    def at_job_time(self) -> bool:
        """A name, not a path: which file it is only the job's environment decides."""
        return os.sep not in self.command

    def describe(self, spec: SlurmJobSpec) -> str:
        if self.source == "container":
            return f"{self.command} inside {spec.container}"
        if self.source == "modules":
            return f"{self.command} as found on the job's PATH after its module lines"
        if self.source == "--python":
            where = (
                f" inside {spec.container}" if spec.container else (" on the job's PATH" if self.at_job_time else "")
            )
            return f"{self.command} (--python){where}"
        return f"{self.command} (the Python running trainscale)"


def job_python(spec: SlurmJobSpec, profile: ClusterProfile) -> JobPython:
    if spec.python:
        return JobPython(spec.python, kit=bool(spec.container) or os.sep not in spec.python, source="--python")
    if spec.container:
        return JobPython("python3", kit=True, source="container")
    if module_lines(spec, profile):
        return JobPython("python3", kit=True, source="modules")
    return JobPython(sys.executable, kit=False, source="this interpreter")
