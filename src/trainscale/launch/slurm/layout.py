"""Where one submission's files live: the run directory (pure path arithmetic; job.py creates it).

    <output-dir>/<name>-<stamp>/       the run: one per `trainscale slurm --submit`
        job.sbatch                     the batch script as submitted
        submission.json                command, resolved job spec, versions, git commit of your code
        src/                           your script (and --snapshot DIR) as submitted: the job runs this copy,
                                       so an edit after --submit never reaches a queued job
        checkpoints/                   the built-in workloads' checkpoints: requeues and chain links resume here
        links                          a chain's job ids, in order
        finished | failed              the chain's end, written by the link that saw it
        <jobid>/                       one SLURM job (a requeue keeps it, a chain link has its own):
            rank-<R>.out, node-<K>.out, errors/, torchrun/, stopped
        <jobid>.out                    that job's batch output
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from trainscale.errors import ConfigError

SRC = "src"


@dataclass(frozen=True)
class Target:
    """What the job runs: a path in the run's copy, or the original (modules, workloads)."""

    script: str | None
    """The script to run (the copy under src/ when it was snapshotted)."""
    pythonpath: str | None
    """Prepended to PYTHONPATH: the copy of --snapshot DIR (so `-m pkg.mod` and sibling imports use it),
    or, for a script copied alone, its original directory (modules next to it import from there)."""
    copies: tuple[tuple[str, str], ...]
    """(source, destination) pairs job.py copies at submission: a file or a directory tree."""


def run_dir_for(output_dir: Path, name: str, stamp: str) -> Path:
    return Path(output_dir) / f"{name}-{stamp}"


def target_in_run(script: str | None, module: str | None, snapshot: str | None, run_dir: Path) -> Target:
    """The copies a submission makes and the paths the job then runs.

    A script is always copied (``src/<file>``); modules next to it still import from its directory.
    With ``--snapshot DIR`` the whole directory is copied (``src/<DIR name>/``), a script inside it runs
    from the copy, and the copy leads PYTHONPATH.
    """
    src = run_dir / SRC
    copies: list[tuple[str, str]] = []
    pythonpath = None
    if snapshot:
        snap = Path(snapshot).absolute()
        dest = src / snap.name
        copies.append((str(snap), str(dest)))
        pythonpath = str(dest)
        if script:
            path = Path(script).absolute()
            try:
                rel = path.relative_to(snap)
            except ValueError:
                copies.append((str(path), str(src / path.name)))
                return Target(str(src / path.name), f"{pythonpath}:{path.parent}", tuple(copies))
            return Target(str(dest / rel), pythonpath, tuple(copies))
        return Target(None, pythonpath, tuple(copies))
    if script:
        path = Path(script).absolute()
        copies.append((str(path), str(src / path.name)))
        return Target(str(src / path.name), str(path.parent), tuple(copies))
    return Target(None, None, ())


def check_snapshot(snapshot: str | None) -> None:
    if snapshot is not None and not Path(snapshot).is_dir():
        raise ConfigError(f"--snapshot {snapshot!r} is not a directory",
                          hint="give the directory of your code (a package, the project), e.g. --snapshot .")
