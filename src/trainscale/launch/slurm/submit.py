"""Submit a rendered script with ``sbatch --parsable`` and cancel jobs. Thin: the subprocess is injectable."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from trainscale.errors import ConfigError, SlurmError
from trainscale.launch.slurm.queue import Runner


@dataclass(frozen=True)
class Submission:
    job_id: str
    cluster: str
    script: Path


def write_script(text: str, path: Path) -> Path:
    """Write the batch script; an existing file is never overwritten."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise SlurmError(
            f"{path} already exists; trainscale does not overwrite files",
            hint="choose another --job-name or --output-dir, or move the old script away",
        ) from None
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    return path


def parse_parsable(stdout: str) -> tuple[str, str]:
    """``sbatch --parsable`` prints ``JOBID`` or ``JOBID;CLUSTER``."""
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    m = re.fullmatch(r"(\d+)(?:;(\S+))?", line.strip())
    if not m:
        raise SlurmError(
            f"cannot read a job id from sbatch's output {stdout!r}",
            hint="expected `sbatch --parsable` to print JOBID or JOBID;CLUSTER",
        )
    return m.group(1), m.group(2) or ""


def submit(
    script: Path, *, run: Runner | None = None, cwd: Path | None = None, extra: tuple[str, ...] = ()
) -> Submission:
    """``sbatch --parsable [EXTRA...] SCRIPT`` (extra: options that are not in the script, e.g. a chain's
    ``--dependency``)."""
    argv = ["sbatch", "--parsable", *extra, str(script)]
    try:
        done = (run or subprocess.run)(argv, capture_output=True, text=True, timeout=120, cwd=cwd)
    except FileNotFoundError:
        raise SlurmError(
            "`sbatch` is not installed here", hint="submit from a SLURM login node, or use --dry-run"
        ) from None
    if done.returncode != 0:
        raise SlurmError(
            f"sbatch refused {script}: {(done.stderr or done.stdout).strip()}",
            hint="read SLURM's message above; `trainscale slurm ... --dry-run` shows the script",
        )
    job_id, cluster = parse_parsable(done.stdout)
    return Submission(job_id=job_id, cluster=cluster, script=Path(script))


def cancel(job_id: str, *, run: Runner | None = None, signal: str | None = None) -> None:
    argv = ["scancel"] + ([f"--signal={signal}"] if signal else []) + [job_id]
    try:
        done = (run or subprocess.run)(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise SlurmError("`scancel` is not installed here", hint="run this on a SLURM login node") from None
    if done.returncode != 0:
        raise SlurmError(
            f"scancel {job_id} failed: {(done.stderr or done.stdout).strip()}",
            hint="check the job id with `trainscale jobs`",
        )


UNREACHABLE = re.compile(
    r"Unable to contact slurm controller|Could not establish a configuration source|"
    r"Socket timed out|Connection refused|Zero Bytes were transmitted|Unable to process "
    r"configuration file|unable to status file|Communication connection failure|"
    r"authentication|Munge|slurm_load_\w+ error",
    re.IGNORECASE,
)
"""sbatch's words when it never got the scheduler's answer (not a refusal of the job)."""


def ask_test_only(script_text: str, *, required: bool = False, run: Runner | None = None) -> tuple[str, str]:
    """``sbatch --test-only``: whether and when SLURM would start this script (it submits nothing).

    Returns (``accepts`` | ``refuses`` | ``unreachable`` | ``no sbatch``, what sbatch said): an unreachable
    scheduler (no controller, no configuration, no munge) is not a refusal of the job. Without sbatch on
    PATH the answer is ``no sbatch``, or, when the answer is ``required`` (--test-only), an error."""
    if run is None and not shutil.which("sbatch"):
        if required:
            raise ConfigError(
                "--test-only needs sbatch, which is not on this machine's PATH",
                hint="run it on a SLURM login node, or use --dry-run",
            )
        return "no sbatch", ""

    with tempfile.NamedTemporaryFile("w", suffix=".sbatch", prefix="trainscale-test-only-") as handle:
        handle.write(script_text)
        handle.flush()
        try:
            done = (run or subprocess.run)(
                ["sbatch", "--test-only", handle.name], capture_output=True, text=True, timeout=120
            )
        except FileNotFoundError:
            raise SlurmError("`sbatch` is not installed here", hint="run this on a SLURM login node") from None
        except subprocess.TimeoutExpired:
            return "unreachable", "sbatch --test-only got no answer within 120 s"
    said = " ".join((done.stderr + done.stdout).split()) or f"exit code {done.returncode}"
    if done.returncode == 0:
        return "accepts", said
    return ("unreachable" if UNREACHABLE.search(said) else "refuses"), said


def test_only_lines(answer: str, said: str) -> list[str]:
    """What ``trainscale slurm`` says about an :func:`ask_test_only` answer."""
    if answer == "unreachable":
        return [
            f"trainscale slurm: could not ask the scheduler (sbatch --test-only: {said}); the job was not checked "
            "by SLURM",
            "  hint: run it where the SLURM controller answers (a login node; `squeue` works there)",
        ]
    if answer == "elsewhere":
        return [
            "trainscale slurm: sbatch --test-only was not asked: this machine's scheduler is not the job's "
            "cluster (the note above)"
        ]
    if answer == "no sbatch":
        return ["trainscale slurm: no SLURM scheduler here (sbatch is not on PATH): the job was not checked by SLURM"]
    return [f"trainscale slurm: sbatch --test-only {'accepts' if answer == 'accepts' else 'REFUSES'} the job: {said}"]
