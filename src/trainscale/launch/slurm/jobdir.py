"""Where a job's files are: the submission record, the job directory and each rank's log (the layout:
docs/slurm.md, "Files of a job: the run directory").

At submission trainscale writes a small JSON record per job under the state directory (:func:`state_dir`)
so ``trainscale jobs JOBID`` can find the files later.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from trainscale.env.slurm import expand_nodelist
from trainscale.errors import SlurmError, TrainscaleError

STATE_VAR = "TRAINSCALE_STATE_DIR"


def state_dir() -> Path:
    if os.environ.get(STATE_VAR):
        return Path(os.environ[STATE_VAR])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "trainscale"


@dataclass(frozen=True, kw_only=True)
class JobRecord:
    """What trainscale remembers about a job it submitted."""

    job_id: str
    cluster: str = ""
    name: str
    launcher: str
    profile: str
    script: str
    """The submitted batch script."""
    output_dir: str
    world_size: int
    ranks_per_node: int
    command: str = ""
    submitted_at: float = 0.0
    batch_output_pattern: str = ""
    """The batch step's output file as submitted (sbatch's ``%j``, ``%x``... patterns); "" for the default."""
    run_dir: str = ""
    """The submission's run directory (launch/slurm/layout.py); "" for jobs submitted before run directories."""
    chain_link: int = 0
    """1, 2, ... for the links of a ``--chain``; 0 for a job on its own."""

    @property
    def job_dir(self) -> Path:
        if self.run_dir:
            return Path(self.run_dir) / self.job_id
        return Path(self.output_dir) / f"{self.name}-{self.job_id}"

    @property
    def batch_output(self) -> Path:
        if not self.batch_output_pattern:
            if self.run_dir:
                return Path(self.run_dir) / f"{self.job_id}.out"
            return Path(self.output_dir) / f"{self.name}-{self.job_id}.out"
        job, _, task = self.job_id.partition("_")
        expanded = re.sub(
            r"%(%|j|x|u|A|a)",
            lambda m: {
                "%": "%",
                "j": self.job_id,
                "x": self.name,
                "u": os.environ.get("USER", ""),
                "A": job,
                "a": task,
            }[m.group(1)],
            self.batch_output_pattern,
        )
        return Path(expanded)


def _record_path(job_id: str) -> Path:
    if not re.fullmatch(r"\d+(?:_\d+)?", job_id):
        raise SlurmError(f"{job_id!r} is not a SLURM job id", hint="job ids are numbers, e.g. 12345 (arrays: 12345_7)")
    return state_dir() / "jobs" / f"{job_id}.json"


def save_record(record: JobRecord) -> Path:
    path = _record_path(record.job_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(record), indent=2) + "\n")
    os.replace(tmp, path)
    return path


LAST = "last"
"""What ``trainscale jobs|report`` take for the newest job submitted with trainscale here."""


def load_record(job_id: str) -> JobRecord:
    """The record of ``job_id``, or of the newest job submitted with trainscale for ``last``."""
    if job_id == LAST:
        records = load_records()
        if not records:
            raise SlurmError(
                f"no job submitted with trainscale is recorded in {state_dir() / 'jobs'}",
                hint="submit one with `trainscale slurm ... --submit`, or give a job id",
            )
        return max(records, key=lambda r: (r.submitted_at or 0.0, r.job_id))
    path = _record_path(job_id)
    if not path.exists():
        raise SlurmError(
            f"no record of job {job_id} in {path.parent}",
            hint=f"only jobs submitted with `trainscale slurm --submit` are known; set {STATE_VAR} to the "
            "state directory used at submission",
        )
    try:
        return JobRecord(**json.loads(path.read_text()))
    except (json.JSONDecodeError, TypeError) as exc:
        raise SlurmError(
            f"the record {path} cannot be read: {exc}", hint="delete it; the job's files are untouched"
        ) from None


def rank_log_text(record: JobRecord, rank: int) -> str:
    """Rank ``rank``'s output: its own file (srun mode) or its prefixed lines from the node logs (torchrun mode)."""
    if not 0 <= rank < record.world_size:
        raise SlurmError(
            f"rank {rank} is outside 0..{record.world_size - 1} of job {record.job_id}",
            hint=f"the job has {record.world_size} ranks",
        )
    job_dir = record.job_dir
    if not job_dir.exists():
        raise SlurmError(
            f"job directory {job_dir} does not exist (yet)",
            hint="the job has not started, or its files were moved; see `trainscale jobs`",
        )
    if record.launcher == "srun":
        path = job_dir / f"rank-{rank}.out"
        if not path.exists():
            raise SlurmError(f"no log for rank {rank} in {job_dir}", hint="the rank may not have started yet")
        return path.read_text(errors="replace")
    prefix = f"[rank{rank}]: "
    lines = []
    node_logs = _node_logs_of(record, rank)
    if not node_logs:
        raise SlurmError(f"no node log in {job_dir} yet (node-*.out)", hint="the job's ranks may not have started yet")
    for node_log in node_logs:
        with open(node_log, errors="replace") as fh:
            lines += [ln[len(prefix) :].rstrip("\n") for ln in fh if ln.startswith(prefix)]
    return "\n".join(lines) + "\n" if lines else ""  # the nodes' logs exist: a rank that printed nothing


_META = re.compile(r'^\{"kind":\s*"meta"')


def _node_logs_of(record: JobRecord, rank: int) -> list[Path]:
    """torchrun mode: the ``node-<K>.out`` logs that hold rank ``rank``'s lines, in the order its attempts
    first ran on them. Each attempt of the rank writes a meta record naming its node
    (``metrics/rank-<R>.jsonl``; torch's rendezvous numbers the nodes in the order they join, so a restart or
    a requeue may move the rank); K is that node's place in the job's node list (the batch output's first
    line). All logs when that is not known. At 1,024 ranks the node logs are all ranks' output together: a
    rank that stayed on its node has one read, not all."""
    every = sorted(record.job_dir.glob("node-*.out"))
    if not record.run_dir:
        return every
    try:
        with open(Path(record.run_dir) / "metrics" / f"rank-{rank}.jsonl", errors="replace") as fh:
            visited = list(dict.fromkeys(json.loads(line).get("node") for line in fh if _META.match(line)))
        with open(record.batch_output, errors="replace") as fh:
            found = re.search(r"^trainscale: job \S+ on (\S+),", fh.readline())

        nodes = expand_nodelist(found.group(1)) if found else []
    except (OSError, ValueError, AttributeError, TrainscaleError):
        return every
    logs = [record.job_dir / f"node-{nodes.index(node)}.out" for node in visited if node in nodes]
    if not visited or len(logs) < len(visited) or not all(log.exists() for log in logs):
        return every  # a node the last allocation does not hold, or a log not written
    return logs


def load_records(directory: Path | None = None) -> list[JobRecord]:
    """Every job record trainscale keeps (for grouping a chain's links); unreadable ones are skipped."""
    found = []
    for path in sorted((directory or state_dir() / "jobs").glob("*.json")):
        try:
            found.append(JobRecord(**json.loads(path.read_text())))
        except (OSError, json.JSONDecodeError, TypeError):
            continue
    return found
