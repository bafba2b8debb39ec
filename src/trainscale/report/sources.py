"""What `trainscale report` was given: a run directory, a study directory, a sweep directory or a SLURM
job id; and where each run of a study or sweep keeps its records."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from trainscale.errors import ConfigError
from trainscale.observe.records import metrics_dir

ACCEPTS = (
    "a run directory (the one `trainscale run` names at its end), a `trainscale bench` study directory "
    "(results.json), a `trainscale sweep` directory (sweep.json), or the id of a job submitted with "
    "`trainscale slurm`"
)


@dataclass(frozen=True)
class Source:
    kind: str
    """run, study or sweep."""
    path: Path
    job_id: str | None = None
    """The SLURM job the user named (its accounting goes in the page)."""


def kind_of(path: Path) -> str | None:
    """study, sweep or run by the files each one's maker writes; None for anything else."""
    if (path / "results.json").is_file():
        return "study"
    if (path / "sweep.json").is_file():
        return "sweep"
    if metrics_dir(path).is_dir() or (path / "run.json").is_file() or (path / "submission.json").is_file():
        return "run"
    return None


def resolve(target: str) -> Source:
    path = Path(target)
    if path.is_symlink() and path.is_dir():  # `latest`: the run it names, by its own name
        path = Path(os.path.normpath(path.parent / os.readlink(path)))
    if path.is_dir():
        kind = kind_of(path)
        if kind is None:
            raise ConfigError(
                f"{target} is not a run, study or sweep directory (no metrics/, run.json, "
                f"submission.json, results.json or sweep.json in it)",
                hint=f"trainscale report takes {ACCEPTS}",
            )
        return Source(kind, path)
    if re.fullmatch(r"\d+(?:_\d+)?|last", target):
        from trainscale.launch.slurm.jobdir import load_record  # noqa: PLC0415 (CLI start-up)

        record = load_record(target)
        run_dir = Path(record.run_dir) if record.run_dir else record.job_dir
        return Source(kind_of(run_dir) or "run", run_dir, record.job_id)
    raise ConfigError(
        f"{target!r} is neither a directory nor a SLURM job id", hint=f"trainscale report takes {ACCEPTS}"
    )


def records_dir(study_dir: Path, run: dict) -> Path | None:
    """Where a study's run recorded itself: the run directory bench wrote in its record; for a study made
    before bench recorded it, or a SLURM configuration (its job's run directory inside), the directory
    under ``runs/<name>/`` that holds the records."""
    if run.get("run_dir"):
        given = study_dir / run["run_dir"]
        return given if metrics_dir(given).is_dir() else None
    root = study_dir / "runs" / run["name"]
    if metrics_dir(root).is_dir():
        return root
    found = sorted(p.parent for p in root.rglob("metrics") if p.is_dir() and any(p.glob("rank-*.jsonl")))
    return found[-1] if found else None
