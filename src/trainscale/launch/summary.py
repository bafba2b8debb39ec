"""Turn torchelastic's failure records into one readable summary: who failed first, where, how, why."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainscale.env import node_name
from trainscale.errors import PEER_GONE
from trainscale.topology.cpulist import format_cpulist


@dataclass(frozen=True)
class RankFailure:
    rank: int
    local_rank: int
    host: str
    pid: int
    exitcode: int
    timestamp: float
    traceback: str
    log_tail: str
    error: str = ""
    """A trainscale error the rank raised (its class, message and hint: a refusal that names the fix), else ""."""

    @property
    def secondary(self) -> bool:
        """Failed because another rank failed: a peer's closed connection, or the agent's SIGTERM to a rank
        that had recorded no error of its own (one that had was stopped on its way out)."""
        return bool(self.lost) or (self.exitcode == -signal.SIGTERM and not self.traceback)

    @property
    def lost(self) -> str:
        """How a rank that lost a peer said so (``connection closed by peer``); "" for any other failure."""
        return next((m.lower() for m in PEER_GONE if m in self.traceback), "")

    @property
    def how(self) -> str:
        if self.exitcode == -signal.SIGTERM and not self.secondary:
            return "failed, then stopped by SIGTERM while exiting"
        return f"killed by {_signal_name(-self.exitcode)}" if self.exitcode < 0 else f"exit code {self.exitcode}"

    @property
    def reason(self) -> str:
        """The exception's own line (``ValueError: boom``), the last line of its traceback; "" without one."""
        lines = [line.strip() for line in self.traceback.splitlines() if line.strip()]
        return lines[-1] if lines else ""

    def describe(self) -> str:
        """``rank 1 on node1 (exit code 1: ValueError: boom)``: one line; for a rank that timed out waiting, the
        rank it names (``exit code 124: rank(s) 1 hung (stopped participating) — rank 1 on node1 ...``)."""
        reason = culprit(self.traceback) or self.reason
        why = f"{self.how}: {reason}" if reason else self.how
        return f"rank {self.rank} on {self.host} ({why if len(why) <= 160 else why[:159] + '…'})"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass(frozen=True)
class Attempt:
    """One run of the worker group: its number (from 1) and, when it failed, the root-cause rank."""

    number: int
    failure: RankFailure | None = None
    """None: the group finished (or was stopped) in this attempt."""


def restart_line(number: int, failure: RankFailure, attempts: int, resume: str | None) -> str:
    """What the console says when the agent restarts the group after attempt ``number`` failed."""
    then = f"restarting all ranks (attempt {number + 1} of {attempts})"
    return f"trainscale: attempt {number} of {attempts} failed: {failure.describe()}; {then}" + (
        f", {resume}" if resume else ""
    )


def stopped_line(signum: int, workers: int, log_dir: Path | None) -> str:
    """The launcher's one line when a signal stopped it (and torch's agent stopped its workers)."""
    where = f"; per-rank logs in {log_dir}" if log_dir else ""
    return f"trainscale: received {_signal_name(signum)}: stopped the {workers} rank(s) of this node{where}"


def attempts_lines(attempts: list[Attempt], total: int) -> list[str]:
    """The run's attempts and how each ended, for the end of a summary; nothing for a single attempt."""
    if len(attempts) < 2:
        return []
    return [
        f"Attempts: {len(attempts)} of {total} (--max-restarts {total - 1}):",
        *(f"  {a.number}: " + (f"failed, {a.failure.describe()}" if a.failure else "finished") for a in attempts),
    ]


def lost_peer(traceback: str) -> bool:
    """The traceback is a rank's report that another rank's end closed its connection: never a root cause."""
    return any(m in traceback for m in PEER_GONE)


# How a rank that timed out names the rank(s) it waited for (runtime/hangwatch/heartbeat.py's CollectiveTimeout):
# those hung ranks, ended by the launcher afterwards, are the root cause.
_HUNG = re.compile(r"rank\(s\) ([\d, ]+) (did not arrive|issued a different collective|stopped responding)")
_HOW = {
    "did not arrive": "hung (stopped participating)",
    "issued a different collective": "called a different collective than the others (a desync)",
    "stopped responding": "stopped responding",
}


def hung_ranks(traceback: str) -> list[int]:
    """The ranks a rank's collective timeout names as the ones it waited for (none when it is no such timeout)."""
    match = _HUNG.search(traceback)
    return [int(r) for r in match.group(1).replace(" ", "").split(",") if r] if match else []


def culprit(traceback: str) -> str:
    """``rank(s) 1 hung (stopped participating) — rank 1 on node3 (pid 4242): step 7, at train.py:40 in main``: the
    ranks a collective timeout names and where the first of them is, as the verdict says it; "" for another error."""
    match = _HUNG.search(traceback)
    if not match:
        return ""
    hung = hung_ranks(traceback)
    where = re.search(rf"^\s+(rank {hung[0]} on \S+ \(pid \d+\): .*)$", traceback, re.MULTILINE)
    return f"rank(s) {', '.join(map(str, hung))} {_HOW[match.group(2)]}" + (f" — {where.group(1)}" if where else "")


def root_cause(rank: int | None, traceback: str, log_tail: str = "") -> str:
    """The failure's root cause when the first failing rank's own report names another (a hung rank, a desync,
    gloo's size mismatch), as one "Root cause: ..." line; "" when its traceback is its own story. The launcher's
    summary and a SLURM job's explanation both say it."""
    match = _HUNG.search(traceback)
    if match:
        return (
            f"Root cause: {culprit(traceback)}; rank {rank} "
            + ("named it" if "desync" in _HOW[match.group(2)] else "timed out waiting and names it")
            + " below, with its Python stack where it could get it"
        )
    if _MISMATCH in log_tail:
        return (
            f"Root cause: the ranks called different collectives (gloo received a message of another size "
            f"than rank {rank}'s collective expected, and aborted it): a rank skipped a collective, "
            "made an extra one, or passed another shape"
        )
    return ""


def next_line(result) -> str:
    """The command that reads a run next: its report (per-rank logs and failures included)."""
    import shlex  # noqa: PLC0415 (CLI start-up)

    from trainscale.launch.rundir import shown  # noqa: PLC0415 (CLI start-up)

    return f"trainscale: next: trainscale report {shlex.quote(shown(result.run_dir))}"


def finished_lines(nproc_per_node: int, max_restarts: int, result) -> str:
    """Where a finished local run went, its restarts if any, and the command that reads it next."""
    from trainscale.launch.rundir import shown, trained_here  # noqa: PLC0415 (CLI start-up)

    run = shown(result.run_dir)
    records = trained_here(result.run_dir)
    what = "step records, " if records else ""
    where = (
        f"run directory {run} ({what}every rank's logs, run.json)"
        if result.run_dir == result.log_dir
        else f"{'records' if records else 'no step records'} in {run}, this node's logs in {shown(result.log_dir)}"
    )
    # (with the records off nothing says whether a rank trained)
    ended = "ended without training: no rank ran an optimizer step" if records is False else "finished"
    return "\n".join(
        [
            f"trainscale: {nproc_per_node} rank(s) {ended} in {result.seconds:.1f}s; {where}",
            *attempts_lines(list(result.attempts), max_restarts + 1),
            next_line(result),
        ]
    )


_NO_ERROR_FILE = "<NONE>"  # torchelastic's message for a worker that left no error file (a signal, os._exit)


def traceback_of(error_data: Any) -> str:
    """The traceback (else the message) ``@record`` wrote into an error file's JSON; '' for none."""
    if not isinstance(error_data, dict):
        return ""
    message = error_data.get("message", error_data)
    if isinstance(message, dict):
        return message.get("extraInfo", {}).get("py_callstack", "") or str(message.get("message", ""))
    return "" if message == _NO_ERROR_FILE else str(message)


def _trainscale_error_of(error_data: Any) -> str:
    """What the worker bootstrap recorded for a TrainscaleError (``extraInfo.trainscale_error``)."""
    message = error_data.get("message") if isinstance(error_data, dict) else None
    extra = message.get("extraInfo", {}) if isinstance(message, dict) else {}
    return str(extra.get("trainscale_error") or "") if isinstance(extra, dict) else ""


def read_end(path: Path, size: int = 256 * 1024) -> str:
    """The last ``size`` bytes of a file, from a line start ('' when it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            end = fh.seek(0, 2)
            fh.seek(max(0, end - size))
            if end > size:
                fh.readline()  # the cut line
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


_CRASH_LINES = ("terminate called", "  what():", "Fatal Python error")
_MISMATCH = "collective mismatch"
"""gloo's words for a message of another size than the collective expected."""
"""How a C++ exception or abort announces itself: the line that says why comes before faulthandler's stacks
(gloo's "Is there a distributed collective mismatch in your code?" among them)."""


def tail(path: Path | None, lines: int = 20) -> str:
    """The last lines of a log, from its last 64 KiB only (a long run's logs are large); a crash's own words
    first, faulthandler's list of extension modules left out."""
    if path is None:
        return ""
    text = read_end(path, 64 * 1024).splitlines()
    said = [line for line in text if line.startswith(_CRASH_LINES)][-4:]
    last = [line for line in text[-lines:] if not line.startswith("Extension modules:") and line not in said]
    return "\n".join(said + (["..."] if said and last else []) + last)


def from_child_failed(error: Any, log_files: dict[int, Path] | None = None) -> list[RankFailure]:
    """RankFailures from a ChildFailedError, earliest first."""
    host = node_name()
    out = []
    for rank, failure in error.failures.items():
        data = failure.error_file_data
        error_file = Path(failure.error_file) if failure.error_file else None
        if not data and error_file and error_file.exists():
            try:
                data = json.loads(error_file.read_text())
            except (OSError, json.JSONDecodeError):
                data = {}
        # torchelastic's timestamps are whole seconds; the error file's mtime orders ranks that
        # failed within the same second.
        when = error_file.stat().st_mtime if error_file and error_file.exists() else float(failure.timestamp)
        out.append(
            RankFailure(
                rank=rank,
                local_rank=failure.local_rank,
                host=host,
                pid=failure.pid,
                exitcode=failure.exitcode,
                timestamp=when,
                traceback=traceback_of(data),
                log_tail="",
                error=_trainscale_error_of(data),
            )
        )
    out.sort(key=lambda f: (f.secondary, f.timestamp, f.rank))
    if out:  # the first's log only: it is the one rendered (reading every rank's would cost the sum of all logs)
        out[0] = dataclasses.replace(out[0], log_tail=tail((log_files or {}).get(out[0].local_rank)))
    return out


def render(
    failures: list[RankFailure],
    world_size: int | None = None,
    log_dir: Path | None = None,
    attempts: list[Attempt] | None = None,
    total_attempts: int = 1,
) -> str:
    if not failures:
        return "trainscale: the run failed, but no rank left a failure record."
    first = failures[0]
    if first.error:  # a refusal that names its fix: the message, not a traceback
        same = [f.rank for f in failures if f.error == first.error]
        who = f"rank {first.rank}" if len(same) == 1 else f"ranks {format_cpulist(same)}"
        return f"trainscale: {who} stopped: {first.error}" + (f"\nPer-rank logs: {log_dir}" if log_dir else "")
    lines = [
        "=" * 72,
        f"trainscale: training FAILED — first failing rank: {first.rank} on {first.host} "
        f"(local rank {first.local_rank}, pid {first.pid}), {first.how}",
    ]
    hung = hung_ranks(first.traceback)
    cause = root_cause(first.rank, first.traceback, first.log_tail)
    if cause:
        lines.append(cause)
    if first.traceback:
        lines += ["", f"Traceback of rank {first.rank}:", first.traceback.rstrip()]
    elif first.log_tail:
        lines += [
            "",
            f"No Python traceback (the process did not raise); last lines of rank {first.rank}'s log:",
            first.log_tail.rstrip(),
        ]
    others = failures[1:]
    if others:  # one line per host and way of failing: 1,023 ranks that died of the first are not 1,023 lines
        lines += ["", "Other ranks:"]
        groups: dict[tuple[str, str], list[int]] = {}
        after = "another rank" if first.secondary else f"rank {first.rank}"  # never a rank that only lost a peer
        for f in others:
            how = (
                f"{f.how} — the hung rank"
                if f.rank in hung
                else f"stopped after {after} failed ({f.lost or f.how})"
                if f.secondary
                else f.how
            )
            groups.setdefault((f.host, how), []).append(f.rank)
        lines += [
            f"  rank {ranks[0]} on {host}: {how}"
            if len(ranks) == 1
            else f"  ranks {format_cpulist(ranks)} on {host}: {how}"
            for (host, how), ranks in groups.items()
        ]
    if world_size:
        failed = {f.rank for f in failures}
        stopped = [r for r in range(world_size) if r not in failed]
        if stopped:
            lines.append(f"  ranks {format_cpulist(stopped)}: stopped by the launcher after the first failure")
    if log_dir:
        lines += ["", f"Per-rank logs: {log_dir}"]
    history = attempts_lines(list(attempts or []), total_attempts)
    if history:
        lines += ["", *history]
    lines.append("=" * 72)
    return "\n".join(lines)
