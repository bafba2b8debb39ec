"""A chain of jobs (``trainscale slurm --chain N``) seen as one thing: its links' states and its own."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainscale.launch.slurm.jobdir import JobRecord, load_records
from trainscale.launch.slurm.queue import JobInfo, job_info


@dataclass(frozen=True)
class Chain:
    run_dir: str
    name: str
    links: tuple[tuple[str, str], ...]
    """(job id, state) per link, in order."""

    @property
    def state(self) -> str:
        """The chain's state: the link that ended the run decides; else the first link still to come."""
        states = [s for _, s in self.links]
        live = [s for s in states if s in ("RUNNING", "PENDING", "REQUEUED", "COMPLETING", "CONFIGURING")]
        if live or "COMPLETED" in states:  # a chain that completed: its links after the finishing one were cancelled
            return live[0] if live else "COMPLETED"
        return states[-1] if states else "UNKNOWN"

    def describe(self) -> str:
        return " ".join(f"{job}:{state}" for job, state in self.links)


def chains(records: list[JobRecord], queued: list[JobInfo], state_of: Callable[[str], str]) -> list[Chain]:
    """The chains with at least one link still queued or running. ``state_of`` asks SLURM for a link that
    squeue no longer lists (sacct, or scontrol where accounting is off)."""
    in_queue = {j.job_id: j.state for j in queued}
    by_run: dict[str, list[JobRecord]] = {}
    for record in records:
        if record.chain_link and record.run_dir:
            by_run.setdefault(record.run_dir, []).append(record)
    out = []
    for run_dir, links in by_run.items():
        links.sort(key=lambda r: r.chain_link)
        if not any(r.job_id in in_queue for r in links):
            continue
        states = tuple((r.job_id, in_queue.get(r.job_id) or state_of(r.job_id)) for r in links)
        out.append(Chain(run_dir=run_dir, name=links[0].name, links=states))
    return out


def queue_table(found: list[JobInfo]) -> list[str]:
    """``trainscale jobs``: squeue's jobs, each chain trainscale submitted as one line after them (a link
    squeue no longer lists is asked for with sacct/scontrol)."""

    def state_of(job_id: str) -> str:
        info = job_info(job_id)
        return info.state if info is not None else "UNKNOWN"

    grouped = chains(load_records(), found, state_of)
    in_chain = {job for c in grouped for job, _ in c.links}
    lines = [f"{'JOBID':<10} {'NAME':<24} {'STATE':<12} {'TIME':>10} {'LIMIT':>10}  NODELIST(REASON)"]
    for j in found:
        if j.job_id in in_chain:
            continue
        where = j.nodelist if j.state == "RUNNING" else f"({j.reason})" if j.reason else j.nodelist
        lines.append(f"{j.job_id:<10} {j.name[:24]:<24} {j.state:<12} {j.elapsed:>10} {j.time_limit:>10}  {where}")
    for c in grouped:
        first = c.links[0][0]
        lines.append(
            f"{first + '+':<10} {c.name[:24]:<24} {c.state:<12} {'chain':>10} {len(c.links):>9}x  {c.describe()}"
        )
    return lines
