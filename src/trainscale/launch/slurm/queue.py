"""Read job states from ``squeue``, ``sacct`` and ``scontrol show job -o``. Parsers are pure; queries are thin.

Every query takes ``run`` (``subprocess.run``'s signature) so tests can replace the SLURM commands
with captured outputs.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from trainscale.errors import SlurmError

Runner = Callable[..., subprocess.CompletedProcess]

# States after which the job will not run again by itself.
TERMINAL = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "TIMEOUT",
        "OUT_OF_MEMORY",
        "NODE_FAIL",
        "CANCELLED",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "REVOKED",
        "SPECIAL_EXIT",
        "REQUEUE_HOLD",
    }
)

SQUEUE_FORMAT = "%i|%j|%T|%M|%l|%D|%u|%r|%N"
SQUEUE_FIELDS = ("job_id", "name", "state", "elapsed", "time_limit", "nodes", "user", "reason", "nodelist")
SACCT_FORMAT = "JobID,JobName,State,ExitCode,Elapsed,NodeList,Restarts,AllocCPUS,TotalCPU,MaxRSS,NNodes"
"""The one sacct format every caller reads (queue states, sweep tasks, the report's accounting)."""


@dataclass(frozen=True, kw_only=True)
class JobInfo:
    """One job's state as a SLURM command reported it."""

    job_id: str
    name: str = ""
    state: str = "UNKNOWN"
    """Base state word, e.g. CANCELLED (sacct's ``CANCELLED by 0`` is split into state and reason)."""
    exit_code: int | None = None
    """The batch script's exit code (first half of SLURM's ``code:signal``)."""
    signal: int | None = None
    """Signal that ended it (second half of ``code:signal``), 0 when none."""
    reason: str = ""
    elapsed: str = ""
    time_limit: str = ""
    nodelist: str = ""
    user: str = ""
    restarts: int = 0
    alloc_cpus: int = 0  # these four: sacct's only (total_cpu, max_rss as it writes them: 01:02:03, 1.5G)
    total_cpu: str = ""
    max_rss: str = ""
    nodes: int = 0
    source: str = ""
    """squeue, sacct or scontrol."""

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


def _exit(text: str) -> tuple[int | None, int | None]:
    m = re.fullmatch(r"\s*(\d+):(\d+)\s*", text or "")
    return (int(m.group(1)), int(m.group(2))) if m else (None, None)


def _state(text: str) -> tuple[str, str]:
    """``CANCELLED by 1000`` -> (CANCELLED, by 1000); ``RUNNING`` -> (RUNNING, '')."""
    word, _, rest = (text or "").strip().partition(" ")
    return word.rstrip("+").upper() or "UNKNOWN", rest.strip()


def parse_squeue(text: str) -> list[JobInfo]:
    """Lines of ``squeue --noheader --format=SQUEUE_FORMAT``."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = line.split("|")
        if len(cells) < len(SQUEUE_FIELDS):
            raise SlurmError(f"cannot read squeue line {line!r}", hint=f"expected the format {SQUEUE_FORMAT}")
        row = dict(zip(SQUEUE_FIELDS, cells[: len(SQUEUE_FIELDS) - 1] + ["|".join(cells[len(SQUEUE_FIELDS) - 1 :])]))
        state, _ = _state(row["state"])
        jobs.append(
            JobInfo(
                job_id=row["job_id"],
                name=row["name"],
                state=state,
                elapsed=row["elapsed"],
                time_limit=row["time_limit"],
                user=row["user"],
                reason="" if row["reason"] == "None" else row["reason"],
                nodelist=row["nodelist"],
                source="squeue",
            )
        )
    return jobs


def _int(text: str) -> int:
    return int(text) if text.isdigit() else 0


def parse_sacct(text: str) -> list[JobInfo]:
    """``sacct --parsable2 --noheader --format=SACCT_FORMAT``: every line (jobs, their steps, array tasks) in order;
    a line with fewer fields (an older capture) leaves the later ones empty."""
    fields = SACCT_FORMAT.split(",")
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        c = dict(zip(fields, line.split("|") + [""] * len(fields)))
        state, reason = _state(c["State"])
        code, sig = _exit(c["ExitCode"])
        rows.append(
            JobInfo(
                job_id=c["JobID"],
                name=c["JobName"],
                state=state,
                reason=reason,
                exit_code=code,
                signal=sig,
                elapsed=c["Elapsed"],
                nodelist=c["NodeList"],
                restarts=_int(c["Restarts"]),
                alloc_cpus=_int(c["AllocCPUS"]),
                total_cpu=c["TotalCPU"],
                max_rss=c["MaxRSS"],
                nodes=_int(c["NNodes"]),
                source="sacct",
            )
        )
    return rows


def parse_scontrol(text: str) -> dict[str, str]:
    """``scontrol show job -o``'s ``Key=Value`` pairs (a value with spaces continues until the next key)."""
    fields: dict[str, str] = {}
    key = None
    for token in text.strip().split(" "):
        m = re.match(r"^([A-Za-z][A-Za-z0-9_:/]*)=(.*)$", token)
        if m:
            key = m.group(1)
            fields[key] = m.group(2)
        elif key is not None and token:
            fields[key] += " " + token
    return fields


def info_from_scontrol(text: str) -> JobInfo | None:
    f = parse_scontrol(text.splitlines()[0] if text.strip() else "")
    if "JobId" not in f:
        return None
    state, _ = _state(f.get("JobState", ""))
    code, sig = _exit(f.get("ExitCode", ""))
    reason = f.get("Reason", "")
    return JobInfo(
        job_id=f["JobId"],
        name=f.get("JobName", ""),
        state=state,
        exit_code=code,
        signal=sig,
        reason="" if reason == "None" else reason,
        elapsed=f.get("RunTime", ""),
        time_limit=f.get("TimeLimit", ""),
        nodelist=f.get("NodeList", ""),
        user=f.get("UserId", "").split("(")[0],
        restarts=int(f.get("Restarts", "0") or 0),
        source="scontrol",
    )


def _run(run: Runner | None, argv: list[str]) -> subprocess.CompletedProcess:
    try:
        return (run or subprocess.run)(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise SlurmError(f"`{argv[0]}` is not installed here", hint="run this on a SLURM login node") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(
            f"`{' '.join(argv)}` did not answer within 60 s",
            hint="the SLURM controller may be overloaded or down; try again",
        ) from None


def squeue(
    run: Runner | None = None, *, user: str | None = None, job_id: str | None = None, array: bool = False
) -> list[JobInfo]:
    """The queue's jobs; ``array``: one line per array task (``JOB_I``), pending ones too, as ``squeue --array``."""
    argv = [
        "squeue",
        "--noheader",
        f"--format={SQUEUE_FORMAT}",
        *([f"--user={user}"] if user else []),
        *([f"--jobs={job_id}"] if job_id else []),
        *(["--array"] if array else []),
    ]
    done = _run(run, argv)
    if done.returncode != 0:
        if job_id and "Invalid job id" in (done.stderr or ""):
            return []
        raise SlurmError(f"squeue failed: {(done.stderr or '').strip()}", hint="is SLURM reachable from here?")
    return parse_squeue(done.stdout)


def sacct(job_id: str, run: Runner | None = None) -> list[JobInfo]:
    """The one sacct reader: every accounting line of a job (itself, its steps, its array's tasks).
    Raises SlurmError when sacct is missing, silent or refuses (accounting disabled)."""
    done = _run(run, ["sacct", "-j", job_id, "--noheader", "--parsable2", f"--format={SACCT_FORMAT}"])
    if done.returncode != 0:
        raise SlurmError(
            f"sacct: {(done.stderr or done.stdout).strip()[:200]}",
            hint="this cluster may keep no accounting; scontrol still knows recent jobs",
        )
    return parse_sacct(done.stdout)


def scontrol_job(job_id: str, run: Runner | None = None) -> JobInfo | None:
    """What the controller still remembers (finished jobs stay for MinJobAge seconds)."""
    done = _run(run, ["scontrol", "show", "job", "-o", job_id])
    return info_from_scontrol(done.stdout) if done.returncode == 0 else None


def job_info(job_id: str, run: Runner | None = None) -> JobInfo | None:
    """Best record of a job: squeue while it is live, then sacct, then ``scontrol show job``."""
    live = [j for j in squeue(run, job_id=job_id) if j.job_id == job_id]
    if live and live[0].state not in TERMINAL and live[0].state != "COMPLETING":
        return live[0]
    try:
        own = next((r for r in sacct(job_id, run) if r.job_id == job_id), None)
    except SlurmError:
        own = None
    return own or scontrol_job(job_id, run) or (live[0] if live else None)
