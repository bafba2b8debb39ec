"""Where one submission's files live: the run directory (pure path arithmetic; job.py creates it).

Its layout, one per `trainscale slurm --submit` (``<output-dir>/<name>-<stamp>/``): docs/slurm.md, "Files of a
job: the run directory". The job runs the script at the same path in the snapshot ``src/<root name>/``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trainscale.errors import ConfigError

if TYPE_CHECKING:
    from trainscale.launch.slurm.script import ScriptFacts

SRC = "src"


@dataclass(frozen=True)
class Target:
    """What the job runs: a path in the run's snapshot, or the original (installed modules, workloads)."""

    script: str | None
    """The script to run: its copy in the snapshot."""
    snapshot: str | None
    """The snapshot's directory in the run (``<run>/src/<root name>``), or None when nothing is copied."""
    pythonpath: str | None
    """Prepended to PYTHONPATH: the snapshot of an explicit ``--snapshot DIR`` (so ``-m pkg.mod`` imports it)."""


def code_root_for(script: str | None, module: str | None, snapshot: str | None, facts: ScriptFacts) -> Path | None:
    """Where the job's code is snapshotted from (launch/slurm/snapshot.py); None: nothing is copied."""
    from trainscale.launch.slurm.snapshot import code_root, module_root  # noqa: PLC0415 (CLI start-up)

    if script:
        return code_root(script, [d for d, _ in facts.path_additions], snapshot)
    if snapshot:
        return Path(snapshot).absolute()
    if module:
        return module_root(module)
    return None


def target_in_run(script: str | None, snapshot: str | None, root: Path | None, run_dir: Path) -> Target:
    """The paths the job runs: the script at the same relative path in ``<run>/src/<root name>/``."""
    if root is None:
        return Target(None, None, None)
    dest = run_dir / SRC / root.name
    pythonpath = str(dest) if snapshot else None
    if script is None:
        return Target(None, str(dest), pythonpath)
    try:
        return Target(str(dest / Path(script).absolute().relative_to(root)), str(dest), pythonpath)
    except ValueError:  # outside --snapshot DIR: lint and check_snapshot refuse it; the dry run shows the original
        return Target(str(Path(script).absolute()), str(dest), pythonpath)


def check_snapshot(snapshot: str | None, script: str | None = None) -> None:
    if snapshot is None:
        return
    if not Path(snapshot).is_dir():
        raise ConfigError(
            f"--snapshot {snapshot!r} is not a directory",
            hint="give the directory of your code (a package, the project), e.g. --snapshot .",
        )
    if script is not None:
        root, path = Path(snapshot).absolute(), Path(script).absolute()
        if root not in path.parents:
            raise ConfigError(
                f"the script {script} is outside --snapshot {snapshot}: the job runs the script from the snapshot",
                hint=f"give --snapshot a directory that holds {Path(script).name} "
                "(your project's root), or leave --snapshot out: the script's project is found for you",
            )
