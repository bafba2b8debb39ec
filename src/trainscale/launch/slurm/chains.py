"""A chain of jobs (``trainscale slurm --chain N``) seen as one thing: its links' states and its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from trainscale.launch.slurm.jobdir import JobRecord
from trainscale.launch.slurm.queue import JobInfo


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
        for state in states:
            if state in ("RUNNING", "PENDING", "REQUEUED", "COMPLETING", "CONFIGURING"):
                return state
        if "COMPLETED" in states:
            return "COMPLETED"  # the finishing link completed; the links after it were cancelled
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
