"""Follow a job until it ends, then say in words what happened and what to do."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

from trainscale.errors import HUNG_EXIT, SlurmError
from trainscale.launch.slurm import queue
from trainscale.launch.slurm.jobdir import JobRecord, rank_log_text
from trainscale.launch.slurm.queue import JobInfo, Runner
from trainscale.launch.slurm.triage import find_failure, step_failure

MEANING = {
    "COMPLETED": ("finished: every task exited with code 0", ""),
    "FAILED": (
        "failed: the batch script or a task exited non-zero",
        "read the first failing rank's traceback above; `trainscale jobs JOBID --rank R` shows any rank's output",
    ),
    "TIMEOUT": (
        "reached its time limit and was stopped by SLURM",
        "ask for more --time, or checkpoint regularly and use --signal USR1@90 so the job saves and "
        "requeues before the limit",
    ),
    "OUT_OF_MEMORY": (
        "was killed because a task used more memory than the job asked for",
        "ask for more memory (--mem-per-gpu), or lower the batch size / DataLoader workers",
    ),
    "NODE_FAIL": (
        "lost a node of its allocation (the node stopped answering the controller)",
        "resubmit (the node is usually drained); with --requeue SLURM requeues such jobs itself",
    ),
    "CANCELLED": (
        "was cancelled (scancel, an administrator, or a dependency that can never be met)",
        "check who cancelled it in the reason; resubmit if it was not on purpose",
    ),
    "PREEMPTED": (
        "was preempted by a higher-priority job",
        "submit with --requeue and --signal USR1@90 so it checkpoints, requeues and resumes",
    ),
    "REQUEUED": ("was requeued and will run again", "wait: it resumes from its newest checkpoint"),
    "BOOT_FAIL": ("could not start because a node failed to boot", "resubmit; tell the admins if it repeats"),
    "DEADLINE": ("missed its --deadline and was removed", "resubmit with a later deadline or a shorter --time"),
    "SPECIAL_EXIT": ("ended with a special exit and is held", "release it with `scontrol release JOBID` to rerun"),
    "REQUEUE_HOLD": ("was requeued and is held", "release it with `scontrol release JOBID`"),
}


def explain(info: JobInfo, record: JobRecord | None = None) -> str:
    """A paragraph on the job's final state; for failures, the first failing rank from the job's files."""
    return outcome(info, record)[0]


def outcome(info: JobInfo, record: JobRecord | None = None) -> tuple[str, int]:
    """:func:`explain`'s paragraph and the exit status `trainscale slurm --watch` gives for it, as `trainscale
    run` would: 0 when the job completed, 124 (errors.HUNG_EXIT) when a hang ended it, else 1."""
    status = 0 if info.state == "COMPLETED" else 1
    meaning, hint = MEANING.get(info.state, (f"ended in state {info.state}", "see `scontrol show job` or sacct"))
    head = f"Job {info.job_id}" + (f" ({info.name})" if info.name else "") + f" {info.state}: {meaning}"
    details = []
    if info.exit_code is not None and info.state != "COMPLETED":
        details.append(f"exit code {info.exit_code}" + (f", signal {info.signal}" if info.signal else ""))
    if info.reason:
        details.append(f"reason {info.reason}")
    if info.elapsed:
        details.append(f"ran {info.elapsed}")
    if info.restarts:
        details.append(f"requeued {info.restarts} time(s)")
    lines = [head + (f" ({'; '.join(details)})" if details else "") + "."]
    if record is not None and info.state != "COMPLETED":
        output = batch_text(record)
        step = step_failure(output)
        failure = None if step else find_failure(record.job_dir, record.launcher, output)
        if step is not None:  # no rank ran: there is no traceback to read
            lines.append(step.describe())
            hint = step.hint
        elif failure is not None:
            lines.append(failure.describe())
            status = HUNG_EXIT if failure.hung else status
            if failure.refusal:
                hint = None  # its one line names the fix
            elif not failure.traceback and info.state == "FAILED":
                who = f"rank {failure.rank}" if failure.rank is not None else "the failing rank"
                hint = (
                    f"{who} left no Python traceback: its log's last lines are above; "
                    "`trainscale jobs JOBID --rank R` shows any rank's output"
                )
        elif output.strip():
            lines += ["Last lines of the batch output:", "\n".join(output.splitlines()[-15:])]
            if info.state == "FAILED":
                hint = "no rank left a traceback: the batch output's last lines above say what stopped the job"
    if hint:
        lines.append(f"Hint: {hint}")
    if record is not None:
        lines.append(f"Files: {record.job_dir} (per-rank logs), {record.batch_output} (batch output)")
    return "\n".join(lines), status


def watch(
    job_id: str,
    *,
    run: Runner | None = None,
    poll_s: float = 2.0,
    timeout_s: float | None = None,
    on_change: Callable[[JobInfo], None] | None = None,
    on_poll: Callable[[JobInfo], None] | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> JobInfo:
    """Poll until the job reaches a final state; ``on_change`` sees every new state (RUNNING, REQUEUED...),
    ``on_poll`` every answer that is not final (a running job's training progress is read there)."""
    start = clock()
    last: tuple[str, int] | None = None
    missing = 0
    while True:
        info = queue.job_info(job_id, run)
        if info is None:
            missing += 1
            if missing >= 3:  # gone from squeue, sacct and scontrol: nothing more can be learnt
                raise SlurmError(
                    f"job {job_id} is not known to squeue, sacct or scontrol",
                    hint="it may have ended longer ago than the controller remembers (MinJobAge); "
                    "look at its files with `trainscale jobs JOBID`",
                )
        else:
            missing = 0
            seen = (info.state, info.restarts)
            if seen != last and on_change is not None:
                on_change(info)
            last = seen
            if info.terminal:
                return info
            if on_poll is not None:
                on_poll(info)
        if timeout_s is not None and clock() - start > timeout_s:
            raise SlurmError(
                f"job {job_id} still {info.state if info else 'unknown'} after {timeout_s:.0f}s of watching",
                hint="it keeps running; watch again later or cancel it with `trainscale jobs JOBID --cancel`",
            )
        sleep(poll_s)


def _clock(seconds: float) -> str:
    seconds = int(max(0, seconds))
    return (
        f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
        if seconds >= 3600
        else f"{seconds // 60}:{seconds % 60:02d}"
    )


def training_progress(run_dir: str | Path | None, now: float | None = None) -> str | None:
    """A running job's training, from rank 0's step records and the run's metrics.csv (what the ranks write to
    the run directory as they train): ``step 120 of 400, 0.031 s/step, loss 0.412, training for 0:42, ETA 0:09``
    (the total and ETA where the loop knows its last step; a script's loss where it logs one with rt.log).
    None before the first step record."""
    if not run_dir:
        return None
    records = Path(run_dir) / "metrics" / "rank-0.jsonl"
    try:
        with open(records, "rb") as fh:
            meta = json.loads(fh.readline())
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 8192))
            tail = fh.read().decode(errors="replace").splitlines()
    except (OSError, ValueError):
        return None
    steps = []
    for line in tail:
        try:
            record = json.loads(line)
        except ValueError:
            continue  # the first line of the window, cut
        if record.get("kind") == "step":
            steps.append(record)
    if not steps:
        return None
    last = steps[-1]
    pace = sorted(r["step_s"] for r in steps[-20:])[len(steps[-20:]) // 2]  # the median of the last 20
    total = meta.get("total_steps")
    said = [f"step {last['step']}" + (f" of {total}" if total else ""), f"{pace:.3g} s/step"]
    loss = _last_loss(Path(run_dir) / "metrics.csv")
    if loss is not None:
        said.append(f"loss {loss:.4g}")
    now = time.time() if now is None else now
    said.append(f"training for {_clock(now - meta.get('t', now))}")
    if total and total > last["step"]:
        said.append(f"ETA {_clock((total - last['step']) * pace)}")
    return ", ".join(said)


def _last_loss(path: Path) -> float | None:
    """The newest value of a key named like a loss in a run's metrics.csv (rt.log's csv tracker: step,key,value)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, 2)
            fh.seek(max(0, fh.tell() - 4096))
            rows = fh.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for row in reversed(rows):
        cells = row.split(",")
        if len(cells) >= 3 and "loss" in cells[1]:
            try:
                return float(cells[2])
            except ValueError:
                continue
    return None


def describe_progress(info: JobInfo) -> str:
    where = f" on {info.nodelist}" if info.nodelist and info.state == "RUNNING" else ""
    why = f" ({info.reason})" if info.reason and info.state == "PENDING" else ""
    restarts = f", restart {info.restarts}" if info.restarts else ""
    return f"job {info.job_id}: {info.state}{where}{why}{restarts}"


def batch_text(record: JobRecord) -> str:
    path = Path(record.batch_output)
    return path.read_text(errors="replace") if path.exists() else ""


def log_lines(record: JobRecord, rank: int | None, tail: int | None) -> list[str]:
    """``trainscale jobs JOB``: one rank's output, or the batch output with the job's first failure and where the
    per-rank logs are."""
    if rank is not None:
        text = rank_log_text(record, rank)
        head = f"==> rank {rank} of job {record.job_id} ({record.launcher} mode) <=="
    else:
        text = batch_text(record)
        head = f"==> batch output of job {record.job_id}: {record.batch_output} <=="
    body = text.splitlines()
    lines = [head, "\n".join(body[-tail:] if tail else body)]
    if rank is None:
        failure = find_failure(record.job_dir, record.launcher, text)
        if failure is not None:
            lines += [f"\n==> failure of job {record.job_id} <==", failure.describe()]
        lines.append(
            f"\n(per-rank logs: trainscale jobs {record.job_id} --rank R, R in 0..{record.world_size - 1}; "
            f"files in {record.job_dir})"
        )
    return lines
