"""After a failed job: which rank failed first, on which host, how, and its traceback — from the job's files.

srun mode: every rank writes ``errors/error-rank<R>.json`` through ``@record`` (bootstrap points
TORCHELASTIC_ERROR_FILE there), srun names each failed task and its host in the batch output.
torchrun mode: each node's agent prints trainscale's failure summary into ``node-<K>.out``; the
earliest ``error.json`` under ``torchrun/`` tells which node's summary holds the first failure.
Files are ordered by modification time (nanoseconds): the JSON's own timestamp has 1 s resolution,
and ranks that fail because a peer died do so within the same second.

What it reads stays small at 1,024 ranks (benchmarks/rank_costs.py): one error file, the end of each log
it needs (never a whole log: a long run's logs are large), a stat per error file; and the other failed
ranks come out grouped, one line per way of failing ("ranks 0-19,22-1023 on 127 nodes: Terminated").

Some jobs fail before any rank runs: SLURM cannot start the job step (``srun: error: Unable to
layout tasks on given cpus``, ``Unable to create step for job``), or the program does not exist on the
node. No rank has a traceback then; :func:`step_failure` names SLURM's own message and the fix.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from trainscale.launch.summary import read_end, root_cause, tail, traceback_of
from trainscale.topology.cpulist import format_cpulist

# Frames of the machinery between the launcher and the user's code: hidden from the summary.
_WRAPPER_FRAMES = (
    "torch/distributed/elastic/multiprocessing/errors",
    "trainscale/launch/bootstrap.py",
    "<frozen runpy>",
)
_SRUN_TASK = re.compile(r"srun: error: (\S+): tasks? ([\d,\-]+): (.+)$")
_SUMMARY = re.compile(r"first failing rank: (\d+) on (\S+) \(local rank (\d+), pid \d+\), (.+)$")
_OTHER = re.compile(r"^ranks? ([\d,\-]+) on (\S+): (.+)$")
_REFUSED = re.compile(r"^trainscale: ranks? ([\d,\-]+) stopped: (.+)$")
"""A node's summary of a trainscale refusal (launch/summary.render): its one line names the fix, no traceback."""


@dataclass(frozen=True)
class StepFailure:
    """SLURM could not start the job step (or its program): no rank ran."""

    said: str
    """SLURM's own words, from the batch output."""
    meaning: str
    hint: str

    def describe(self) -> str:
        return f"SLURM could not start the ranks: {self.meaning}\nSLURM said: {self.said}"


# (pattern in the batch output, what it means, the fix); the first that matches wins.
_STEP_FAILURES = (
    (
        re.compile(r"srun: error: .*(?:Unable to layout tasks on given cpus|failed to distribute tasks)"),
        "the step's tasks do not fit the CPUs SLURM gave the job on a node (CPUs per task x tasks per node, laid out "
        "on cores and sockets, is more than the node can place)",
        "give each task fewer CPUs (-c/--cpus-per-task) or run fewer ranks per node; `scontrol show node` shows a "
        "node's real cores and sockets",
    ),
    (
        re.compile(r"srun: error: Unable to create step for job \d+: (.+)"),
        "the job step asks for more than the job's allocation ({0})",
        "check --cpus-per-task, --ntasks-per-node and --mem against the #SBATCH lines (the step asks for what the "
        "script's srun line says; `trainscale slurm --dry-run` shows both)",
    ),
    (
        re.compile(r"srun: error: Unable to allocate resources: (.+)"),
        "SLURM refused the step's resources ({0})",
        "compare the srun line with the #SBATCH lines in the batch script",
    ),
    (
        re.compile(r"slurmstepd: error: execve\(\): (\S+): No such file or directory"),
        "the program {0} does not exist on the node",
        "give a path the compute nodes see (--python PATH), or load the module that provides it (--module)",
    ),
    (
        re.compile(r"srun: fatal: (.+)"),
        "srun stopped: {0}",
        "read SLURM's message; the batch script is job.sbatch in the run directory",
    ),
)


def step_failure(batch_output: str) -> StepFailure | None:
    """SLURM's own reason a job step never started, when the batch output has one."""
    lines = batch_output.splitlines()
    for pattern, meaning, hint in _STEP_FAILURES:
        found = [(m, line) for line in lines for m in [pattern.search(line)] if m]
        if found:  # SLURM's plainest line of several: the last ("Application launch failed: Unable to ...")
            m, line = found[-1]
            return StepFailure(said=line.strip(), meaning=meaning.format(*m.groups()), hint=hint)
    return None


@dataclass(frozen=True, kw_only=True)
class Failure:
    """The first rank that failed, and what is known about the others."""

    rank: int | None
    host: str = ""
    how: str = ""
    traceback: str = ""
    log_tail: str = ""
    others: tuple[str, ...] = field(default_factory=tuple)
    refusal: bool = False
    """trainscale refused to go on (``how``: its one line, the fix in it): no traceback to look for."""

    @property
    def cause(self) -> str:
        """The root cause the first failing rank's report names (a hung rank, a desync), as `trainscale run`
        says it: a node's launcher summary carries the line already (torchrun mode); an error file, the
        collective timeout it comes from (srun mode)."""
        said = [line for line in self.traceback.splitlines() if line.startswith("Root cause:")]
        return said[0] if said else root_cause(self.rank, self.traceback, self.log_tail)

    @property
    def hung(self) -> bool:
        """A hang ended the job (the hang timeout, or a collective's): its exit status is 124, as `run`'s."""
        return " hung (stopped participating)" in self.cause

    def describe(self) -> str:
        who = f"rank {self.rank}" if self.rank is not None else "a rank"
        if self.refusal:
            return f"First failing rank: {who} stopped: {self.how}"
        lines = [
            f"First failing rank: {who}"
            + (f" on {self.host}" if self.host else "")
            + (f", {self.how}" if self.how else "")
        ]
        cause = self.cause
        if cause:
            lines.append(cause)
        traceback = "\n".join(line for line in self.traceback.splitlines() if line != cause)
        if traceback.strip():
            lines += [f"Traceback of {who}:", trim_traceback(traceback).strip("\n").rstrip()]
        elif self.log_tail:
            lines += [f"No Python traceback; last lines of {who}'s log:", self.log_tail.rstrip()]
        if self.others:
            lines += ["Other ranks:"] + [f"  {o}" for o in self.others]
        return "\n".join(lines)


def trim_traceback(text: str) -> str:
    """Drop the launcher's own frames (@record's wrapper, bootstrap, runpy) so the user's frames stand out."""
    out, skipping = [], False
    for line in text.splitlines():
        if line.startswith("  File "):
            skipping = any(w in line for w in _WRAPPER_FRAMES)
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            out.append(line)
    return "\n".join(out)


def _expand(tasks: str) -> list[int]:
    out: list[int] = []
    for part in tasks.split(","):
        lo, _, hi = part.partition("-")
        if lo.isdigit():
            out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def srun_task_errors(batch_output: str) -> dict[int, tuple[str, str]]:
    """rank -> (host, what srun said), in the order srun reported them."""
    found: dict[int, tuple[str, str]] = {}
    for line in batch_output.splitlines():
        m = _SRUN_TASK.search(line)
        if m:
            for rank in _expand(m.group(2)):
                found.setdefault(rank, (m.group(1), m.group(3).strip()))
    return found


def callstack(path: Path) -> str:
    """The traceback @record wrote into an error file ('' when it cannot be read)."""
    try:
        return traceback_of(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError):
        return ""


def _by_time(paths: list[Path]) -> list[Path]:
    return sorted(paths, key=lambda p: (p.stat().st_mtime_ns, str(p)))


def grouped(others: list[tuple[int, str, str]]) -> tuple[str, ...]:
    """``(rank, host, how)`` of the other failed ranks, one line per ``how`` (in the order first seen):
    ``rank 3 on n2: Terminated``, ``ranks 0-19,22-31 on 16 nodes: Terminated``."""
    by_how: dict[str, list[tuple[int, str]]] = {}
    for rank, host, how in others:
        by_how.setdefault(how, []).append((rank, host))
    lines = []
    for how, ranks in by_how.items():
        hosts = sorted({h for _, h in ranks if h})
        where = f" on {hosts[0]}" if len(hosts) == 1 else f" on {len(hosts)} nodes" if hosts else ""
        who = f"rank {ranks[0][0]}" if len(ranks) == 1 else f"ranks {format_cpulist(r for r, _ in ranks)}"
        lines.append(f"{who}{where}: {how}")
    return tuple(lines)


def srun_failure(job_dir: Path, batch_output: str) -> Failure | None:
    tasks = srun_task_errors(batch_output)
    files = _by_time(list((job_dir / "errors").glob("error-rank*.json")))
    ranks = [int(re.search(r"(\d+)", p.stem.rsplit("rank", 1)[1]).group(1)) for p in files]  # type: ignore[union-attr]
    if not ranks and not tasks:
        return None
    first, tb = (ranks[0], callstack(files[0])) if ranks else (next(iter(tasks)), "")
    host, how = tasks.get(first, ("", ""))
    others = [
        (r, *tasks[r]) if r in tasks else (r, "", "raised too (after the first)")
        for r in dict.fromkeys(ranks[1:] + list(tasks))
        if r != first
    ]
    return Failure(
        rank=first,
        host=host,
        how=how or "raised an exception",
        traceback=tb,
        log_tail=tail(job_dir / f"rank-{first}.out"),
        others=grouped(others),
    )


def _summaries(text: str) -> list[tuple[Failure, str]]:
    """Each trainscale failure summary in a node log, with its traceback block."""
    found = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        refused = _REFUSED.match(line)
        if refused:
            found.append((Failure(rank=_expand(refused.group(1))[0], how=refused.group(2).strip(), refusal=True), ""))
            continue
        m = _SUMMARY.search(line)
        if not m:
            continue
        block: list[str] = []
        others: list[str] = []
        for nxt in lines[i + 1 :]:
            if nxt.startswith("=" * 20):
                break
            if nxt.startswith("  rank ") or nxt.startswith("  ranks "):
                others.append(nxt.strip())
            elif not nxt.startswith(("Traceback of rank", "Other ranks:", "Per-rank logs:", "No Python traceback")):
                block.append(nxt)
        tb = "\n".join(block).strip()
        found.append(
            (
                Failure(
                    rank=int(m.group(1)), host=m.group(2), how=m.group(4).strip(), traceback=tb, others=tuple(others)
                ),
                tb,
            )
        )
    return found


_TORCH_FAILURE = re.compile(
    r"host\s*:\s*(?P<host>\S+)\s*\n\s*rank\s*:\s*(?P<rank>\d+) \(local_rank: (?P<local>\d+)\)"
    r"\s*\n\s*exitcode\s*:\s*(?P<code>-?\d+)[^\n]*\n\s*error_file\s*:\s*(?P<file>\S+)"
)


def torch_agent_failure(job_dir: Path, logs: str) -> Failure | None:
    """The image's own torchrun (a stock container) prints torch's ChildFailedError report, not
    trainscale's summary: its failures, the one whose error file was written first being the root."""
    found = list(_TORCH_FAILURE.finditer(logs))
    if not found:
        return None

    def written(m) -> float:
        path = Path(m["file"])
        return path.stat().st_mtime if path.exists() else float("inf")

    found.sort(key=lambda m: (written(m), int(m["rank"])))
    first = found[0]
    code = int(first["code"])
    how = f"exit code {code}" if code >= 0 else f"killed by signal {-code}"
    others = tuple(dict.fromkeys(f"rank {m['rank']} on {m['host']}" for m in found[1:] if m["rank"] != first["rank"]))
    tb = callstack(Path(first["file"])) if Path(first["file"]).exists() else ""
    return Failure(rank=int(first["rank"]), host=first["host"], how=how, traceback=tb, others=others)


def _others(failure: Failure, summaries: list[Failure]) -> tuple[str, ...]:
    """Every node's failed ranks but ``failure``'s, grouped where they say ``rank R on HOST: how``; lines
    of another form (a summary's ``ranks ...: stopped``) once each, as they are."""
    parsed = [(f.rank, f.host, f.how) for f in summaries if f is not failure]
    kept = []
    for line in (line for f in summaries for line in f.others):
        m = _OTHER.match(line)
        if m:
            parsed += [(rank, m.group(2), m.group(3)) for rank in _expand(m.group(1))]
        else:
            kept.append(line)
    return grouped(parsed) + tuple(dict.fromkeys(kept))


def torchrun_failure(job_dir: Path) -> Failure | None:
    texts = [read_end(log) for log in sorted(job_dir.glob("node-*.out"))]  # the agent's summary is its last output
    summaries = [found for text in texts for found in _summaries(text)]
    if not summaries:
        return torch_agent_failure(job_dir, "\n".join(texts))
    failure = summaries[0][0]
    errors = _by_time(list((job_dir / "torchrun").glob("**/error.json")))
    if errors:
        first_tb = callstack(errors[0]).strip().splitlines()
        key = first_tb[-1] if first_tb else ""
        failure = next((f for f, tb in summaries if key and key in tb), failure)
    same = [f for f, _ in summaries if not (f.refusal and f is not failure and f.how == failure.how)]  # said once
    return Failure(
        rank=failure.rank,
        host=failure.host,
        how=failure.how,
        traceback=failure.traceback,
        others=_others(failure, same),
        refusal=failure.refusal,
    )


def find_failure(job_dir: Path, launcher: str, batch_output: str = "") -> Failure | None:
    """The first failing rank of a job, or None when its files do not say."""
    if not job_dir.exists():
        return None
    if launcher == "torchrun":
        return torchrun_failure(job_dir)
    return srun_failure(job_dir, batch_output)
