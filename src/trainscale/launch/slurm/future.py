"""A submitted job as a future: its state, waiting for it, its result, its logs, cancelling it.

Made by ``trainscale.slurm.submit`` and ``map_array`` (launch/slurm/api.py); ``Job.attach(job_id)`` finds a
job submitted earlier from its record (``trainscale jobs`` lists them). An element of an array job is
``ARRAY_INDEX`` (``1234_2``): SLURM's own name for it in squeue, sacct and scancel.
"""

from __future__ import annotations

import dataclasses
import json
import pickle
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainscale.errors import RankFailed, SlurmError
from trainscale.launch.runner import failure, read_failures, read_results, result_path
from trainscale.launch.slurm import queue
from trainscale.launch.slurm.jobdir import JobRecord, load_record, rank_log_text
from trainscale.launch.slurm.queue import JobInfo
from trainscale.launch.slurm.submit import cancel as scancel
from trainscale.launch.slurm.triage import find_failure
from trainscale.launch.slurm.watch import batch_text, explain

RESULT_WAIT_S = 60.0
"""How long a COMPLETED job's result file may take to appear here (a shared file system's caches)."""


@dataclass(frozen=True)
class Job:
    """One submitted job (or one element of an array job)."""

    job_id: str
    """SLURM's id: ``1234``, or ``1234_2`` for element 2 of array job 1234."""
    directory: Path
    """Where the call, the ranks' results and errors are: the run directory, or an array element's ``task-<i>``."""
    record: JobRecord
    """What was submitted (for an array element: the array's)."""
    function: bool = True
    """A function (result() returns rank 0's return value) or a script (result() returns None)."""

    def __repr__(self) -> str:
        return f"Job({self.job_id}, {self.record.name}, run directory {self.record.run_dir})"

    @classmethod
    def attach(cls, job_id: str) -> Job:
        """A job submitted earlier (by this user, with its record in the state directory)."""
        array, _, index = str(job_id).partition("_")
        record = load_record(array)
        directory = Path(record.run_dir) / (f"task-{index}" if index else "")
        return cls(str(job_id), directory, record, function=(directory / "call.pkl").exists())

    # -- state ------------------------------------------------------------------------------------
    def info(self) -> JobInfo | None:
        """What SLURM says now (squeue while live, then sacct or scontrol); None when it knows nothing yet."""
        info = queue.job_info(self.job_id)
        if info is None and "_" in self.job_id:  # a pending element may show only as the array's 1234_[2-5]
            array = self.job_id.partition("_")[0]
            if any(j.state == "PENDING" for j in queue.squeue(job_id=array)):
                return JobInfo(job_id=self.job_id, name=self.record.name, state="PENDING", source="squeue")
        return info

    @property
    def state(self) -> str:
        """PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, ... (UNKNOWN when SLURM has no word of it)."""
        info = self.info()
        return info.state if info is not None else "UNKNOWN"

    def done(self) -> bool:
        return self.state in queue.TERMINAL

    def wait(self, timeout: float | None = None, poll: float = 1.0) -> JobInfo:
        """Block until the job has ended; its final state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        missing = 0
        while True:
            info = self.info()
            if info is not None and info.terminal:
                return info
            missing = missing + 1 if info is None else 0
            if missing >= 10:
                raise SlurmError(
                    f"job {self.job_id} is not known to squeue, sacct or scontrol",
                    hint="it ended longer ago than the controller remembers (MinJobAge); its files are "
                    f"in {self.record.run_dir}",
                )
            if deadline is not None and time.monotonic() > deadline:
                raise SlurmError(
                    f"job {self.job_id} still {info.state if info else 'not started'} after {timeout:g}s",
                    hint="it keeps running: wait again, or cancel it with job.cancel()",
                )
            time.sleep(poll)

    # -- outcome ----------------------------------------------------------------------------------
    def result(self, timeout: float | None = None) -> Any:
        """Wait, then rank 0's return value (a script: None). A rank that raised makes this raise
        :class:`~trainscale.errors.RankFailed` with its rank and traceback; a job that ended otherwise
        (cancelled, out of time or memory) a SlurmError saying how."""
        info = self.wait(timeout)
        if info.state == "COMPLETED":
            return self._result() if self.function else None
        raise self._failure(info)

    def results(self, timeout: float | None = None) -> list[Any]:
        """Wait, then every rank's return value, indexed by rank (a function's job only)."""
        self.result(timeout)
        return read_results(self.directory, self.record.world_size)

    def _result(self) -> Any:
        path = result_path(self.directory, 0)
        deadline = time.monotonic() + RESULT_WAIT_S
        while not path.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        if not path.exists():
            raise SlurmError(
                f"job {self.job_id} COMPLETED but left no result in {self.directory}",
                hint="the compute nodes must write to the run directory: give output_dir= on a file "
                "system they share with this machine",
            )
        return pickle.loads(path.read_bytes())

    def _failure(self, info: JobInfo) -> Exception:
        records = read_failures(self.directory) if self.function else []
        if records:
            return failure(records, "", f"job {self.job_id}")
        own = self._own_record()
        text = explain(info, own)
        if own is not None and info.state == "FAILED":
            found = find_failure(own.job_dir, own.launcher, batch_text(own))
            if found is not None and found.rank is not None:
                return RankFailed(text, rank=found.rank, traceback=found.traceback)
        return SlurmError(text, hint=None)

    # -- files and control ------------------------------------------------------------------------
    def _own_record(self) -> JobRecord | None:
        """This job's record with its own SLURM id (an array element runs as a job of its own, whose
        directory and batch output are named by that id); None while an element has not started."""
        if "_" not in self.job_id:
            return self.record
        known = self.directory / "job.json"
        raw = json.loads(known.read_text())["job_id"] if known.exists() else None
        if raw is None:
            info = queue.scontrol_job(self.job_id)
            raw = info.job_id if info is not None and info.job_id.isdigit() else None
        return dataclasses.replace(self.record, job_id=raw) if raw else None

    def logs(self, rank: int | None = None) -> str:
        """The batch output (rank None), or one rank's output."""
        own = self._own_record()
        if own is None:
            raise SlurmError(f"job {self.job_id} has not started: no logs yet", hint="job.wait() or look at job.state")
        if rank is None:
            path = own.batch_output
            if not path.exists():
                raise SlurmError(f"no batch output {path} yet", hint="the job has not started; see job.state")
            return path.read_text(errors="replace")
        return rank_log_text(own, rank)

    def cancel(self) -> None:
        scancel(self.job_id)
