"""Who waits for whom: the verdict on a hang, from every rank's heartbeat record (runtime/hangwatch/heartbeat.py).
Pure: records in, a :class:`Verdict` out.

Ranks that have waited in a collective for the notice interval wait for somebody. Of the collective they
wait in (#K of a process group, the oldest still in flight), each other rank is one of:

- **missing**: it has issued fewer than K collectives on that group (or is steps behind): it never joined.
  Its heartbeat says where it is instead (its frame, every thread's stack).
- **desync**: it issued collective #K, but another one (another op or other sizes): the ranks called
  different collectives (one skipped a call, made an extra one, or passed another shape).
- **unresponsive**: its heartbeat stopped (a stopped process, or Python holding the GIL in C code).

Nobody missing, no desync, everybody alive and inside #K: the collective itself is stuck (the network, a
peer's device). The words name the ranks as the launcher's summary reads them ("rank(s) N did not arrive").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

STALE_S = 6.0
"""A rank whose heartbeat (every 0.5 s, a record at least every 2 s) has been silent this long is unresponsive."""
UNREACHABLE = "unreachable"
"""A rank whose record could not be read (the store went with rank 0)."""
HINT = (
    "look at the named rank's stack and log for what holds it (a data loader stall, a deadlock, a rank that "
    "skipped or added a collective); the run ends at --hang-timeout (default 10 min once training steps ran) "
    "or at the collective timeout (the timeout= of init_process_group: 30 min for gloo, 10 for NCCL by default; "
    "--timeout for trainscale's workloads), whichever comes first"
)


@dataclass
class State:
    """One rank's heartbeat record as the watcher saw it."""

    rank: int
    step: int = -1
    op: str = ""
    """What ``rt.guard`` said the rank does ("training step (gradient all-reduce)"); empty for a plain script."""
    issued: dict[str, int] = field(default_factory=dict)
    since: float = 0.0
    """Seconds since its step or its collectives issued last changed (on its own clock)."""
    site: str | None = None
    """Where its main thread is."""
    host: str = "?"
    pid: int | None = None
    counts: list[list[int]] = field(default_factory=list)
    """[step, collectives issued on the default group by the end of it] for its last optimizer steps."""
    ledger: list[dict[str, Any]] | None = None
    """Its last collectives, oldest first: {"pg", "seq", "op", "sizes", "site", "age_s", "done"} (sent once its
    progress has stalled a few seconds)."""
    stacks: str | None = None
    dump: str | None = None
    """Where its C watchdog writes every thread's stack when its heartbeat stops (observe: read if shared)."""
    silent_s: float = 0.0
    """How long the watcher has seen no new beat of it."""
    process: str | None = None
    """A silent rank's process state, where the watcher could look (same host): stopped, running, gone."""

    @classmethod
    def from_record(cls, rank: int, record: dict[str, Any], silent_s: float = 0.0) -> State:
        names = {f for f in cls.__dataclass_fields__ if f not in ("rank", "silent_s", "process")}
        return cls(rank=rank, silent_s=silent_s, **{k: v for k, v in record.items() if k in names})

    @property
    def responsive(self) -> bool:
        return self.silent_s < STALE_S

    @property
    def wait(self) -> list[dict[str, Any]]:
        """Its collectives in flight (issued, not completed here)."""
        return [e for e in self.ledger or () if not e.get("done")]

    def waited(self) -> float:
        return max((w.get("age_s") or 0.0 for w in self.wait), default=0.0)

    def entry(self, group: str, seq: int) -> dict[str, Any] | None:
        return next((e for e in self.ledger or () if e.get("pg") == group and int(e.get("seq", -1)) == seq), None)


@dataclass
class Verdict:
    kind: str
    """missing, desync, unresponsive or stuck."""
    waiting: list[int]
    culprits: list[int]
    collective: str
    waited_s: float
    lines: list[str]

    def text(self) -> str:
        return "\n".join(self.lines)

    def event(self) -> dict[str, Any]:
        return {
            "kind": "hang",
            "verdict": self.kind,
            "waiting": self.waiting,
            "culprits": self.culprits,
            "collective": self.collective,
            "waited_s": round(self.waited_s, 1),
            "message": self.lines[0],
            "text": self.text()[:6000],
        }


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))


def _collective(entry: dict[str, Any]) -> str:
    group = str(entry.get("pg", "")).removeprefix("pg:")
    sizes = entry.get("sizes")
    shape = (
        (f" of shape {sizes[0]}" if isinstance(sizes, list) and len(sizes) == 1 else f" of shapes {sizes}")
        if sizes
        else ""
    )
    return f"{entry.get('op', '?')}{shape} (collective #{entry.get('seq', '?')} of process group {group})"


def _where(state: State) -> str:
    at = f", at {state.site}" if state.site else ""
    return (
        f"rank {state.rank} on {state.host}" + (f" (pid {state.pid})" if state.pid else "") + f": step {state.step}{at}"
    )


def _silent(state: State) -> str:
    how = {"running": "its process is running: its Python holds the GIL in C code (a regex, a C extension)"}.get(
        state.process or "",
        f"its process is {state.process}"
        if state.process
        else "its process is stopped, or its Python holds the GIL in C code",
    )
    return (
        f"rank {state.rank} on {state.host}"
        + (f" (pid {state.pid})" if state.pid else "")
        + f": not responding for {state.silent_s:.0f}s ({how})"
    )


def count_desync(states: dict[int, Any]) -> Verdict | None:
    """A desync shown by the ranks' collective counts at the end of the same optimizer step (each rank counts its
    own at its step boundary, so no clock is compared): the first step where they differ, or None. The ranks whose
    count differs from the most ranks' (from rank 0's where no count has a majority, as with two ranks) are named."""
    counts = {r: {int(k): int(n) for k, n in s.counts} for r, s in states.items() if isinstance(s, State) and s.counts}
    for step in sorted({step for c in counts.values() for step in c}):
        at = {r: c[step] for r, c in counts.items() if step in c}  # the ranks that ended it
        if len(set(at.values())) == 1:
            continue
        culprits, reference = _odd_ones(at)
        common = at[reference]
        lines = [
            f"desync: by the end of step {step} the ranks had issued different numbers of collectives on the "
            f"default process group (their gradients mix from then on) — rank(s) {_ranks(culprits)} issued a "
            f"different collective sequence than rank {reference}: it skipped or added a collective in step "
            f"{step}"
        ]
        lines += [
            f"  {_where(states[r])}: {n} collective(s) by the end of step {step}"
            + (f" ({n - common:+d} against rank {reference})" if n != common else "")
            for r, n in sorted(at.items())
        ]
        return Verdict(
            kind="desync", waiting=[], culprits=culprits, collective=f"step {step}", waited_s=0.0, lines=lines
        )
    return None


def _odd_ones(values: dict[int, Any]) -> tuple[list[int], int]:
    """(the ranks whose value differs from the most ranks' — from rank 0's, or the lowest rank's, where no value
    has a majority, as with two ranks —, the rank whose value they are compared with)."""
    tally: dict[str, list[int]] = {}
    for r, v in sorted(values.items()):
        tally.setdefault(str(v), []).append(r)
    most = max(len(ranks) for ranks in tally.values())
    leaders = [ranks for ranks in tally.values() if len(ranks) == most]
    common = min(leaders) if len(leaders) > 1 else leaders[0]
    return sorted(r for r, v in values.items() if str(v) != str(values[common[0]])), common[0]


def ledger_desync(states: dict[int, Any]) -> Verdict | None:
    """A desync shown by the ranks' flight records: a collective with the same number on a process group, still in
    flight on some rank, that two ranks issued with another op or other sizes (done on one of them or not), or None."""
    seen: dict[tuple[str, int], dict[int, dict[str, Any]]] = {}
    for r, s in states.items():
        for e in (s.ledger or ()) if isinstance(s, State) else ():
            if not e.get("assumed") and e.get("sizes") is not None:
                seen.setdefault((str(e["pg"]), int(e["seq"])), {})[r] = e
    for (group, seq), entries in sorted(seen.items(), key=lambda item: item[0][1]):
        # one still in flight (the job is held up there), on ranks that all issued it in this group (a recorder
        # keeps a destroyed group's collectives under the same name)
        entries = {r: e for r, e in entries.items() if states[r].issued.get(group, -1) >= seq}
        if (
            len(entries) < 2
            or all(e.get("done") for e in entries.values())
            or len({(e.get("op"), str(e.get("sizes"))) for e in entries.values()}) == 1
        ):
            continue
        culprits, reference = _odd_ones({r: (e.get("op"), e.get("sizes")) for r, e in entries.items()})
        lines = [
            f"desync: the ranks called different collectives as collective #{seq} of process group "
            f"{group.removeprefix('pg:')} — rank(s) {_ranks(culprits)} issued a different collective than rank "
            f"{reference} (it skipped or added a collective before it, or passed another shape)"
        ]
        for r, e in sorted(entries.items()):
            where = f"issued at {e['site']}" if e.get("site") else f"now at {states[r].site}" if states[r].site else ""
            lines.append(
                f"  rank {r} on {states[r].host} (pid {states[r].pid}): {_collective(e)}"
                + (f", {where}" if where else "")
            )
        return Verdict(
            kind="desync",
            waiting=[],
            culprits=culprits,
            collective=_collective(entries[reference]),
            waited_s=0.0,
            lines=lines,
        )
    return None


def diagnose(states: dict[int, Any], *, notice_s: float, observer: int | None = None) -> Verdict | None:
    """The verdict once some rank has waited ``notice_s`` in a collective (``observer``: the rank asking, which
    knows it waits — its collective timed out), or None. ``states``: rank -> :class:`State`, None (no record:
    never started) or :data:`UNREACHABLE`."""
    alive = {r: s for r, s in states.items() if isinstance(s, State)}
    waiting = {r: s for r, s in alive.items() if s.responsive and s.wait and (s.waited() >= notice_s or r == observer)}
    if not waiting:
        return None
    oldest = max(waiting.values(), key=State.waited)
    group = oldest.wait[0]["pg"]
    # the collective holding everybody up: the lowest one in flight on that group, on any rank
    seq = min(int(e["seq"]) for s in alive.values() if s.responsive for e in s.wait if e["pg"] == group)
    entry = next(e for s in alive.values() for e in s.wait if e["pg"] == group and int(e["seq"]) == seq)
    top_step = max(s.step for s in waiting.values())
    missing = {
        r
        for r, s in states.items()
        if s is None or (isinstance(s, State) and (s.issued.get(group, seq) < seq or s.step < top_step))
    }
    for channel in {c for s in alive.values() for c in s.issued} - {group}:
        # other groups and channels (comm_hook=shm's): of ranks that differ, the farthest back holds the others up
        counts = {r: s.issued[channel] for r, s in alive.items() if channel in s.issued}
        if len(set(counts.values())) > 1:
            missing |= {r for r, n in counts.items() if n == min(counts.values())}
    missing = sorted(missing)
    unreachable = sorted(r for r, s in states.items() if s == UNREACHABLE)
    joined = {r: s.entry(group, seq) for r, s in alive.items() if r not in missing}
    signatures: dict[tuple, list[int]] = {}
    for r, w in joined.items():
        if w is not None and not w.get("assumed"):
            signatures.setdefault((w.get("op"), str(w.get("sizes"))), []).append(r)
    silent = sorted(r for r, s in alive.items() if not s.responsive)
    waited = oldest.waited()
    names = sorted(waiting)
    head = f"rank(s) {_ranks(names)} waited {waited:.0f}s in {_collective(entry)}" + (
        f", issued at {entry['site']}" if entry.get("site") else ""
    )

    def stack_of(rank: int) -> list[str]:
        state = alive.get(rank)
        text = state.stacks if state is not None else None
        if text:
            return [f"rank {rank}'s Python stack (every thread, innermost last):", text]
        if state is not None and not state.responsive:
            if state.process and state.process.startswith("stopped"):
                return [f"rank {rank} sent no stack: its process is stopped (every thread of it)"]
            return [
                f"rank {rank} sent no stack: its heartbeat stopped (a stopped process, or its Python holding "
                "the GIL in C code)" + (f"; its watchdog writes them to {state.dump}" if state.dump else "")
            ]
        return []

    if missing:
        lines = [f"{head} — rank(s) {_ranks(missing)} did not arrive"]
        for rank in missing:
            state = alive.get(rank)
            if state is None:
                lines.append(f"  rank {rank}: no heartbeat (it never joined the process group, or died)")
            elif not state.responsive:
                lines.append(
                    f"  {_silent(state)}; last heard of at step {state.step}"
                    + (f", at {state.site}" if state.site else "")
                )
            else:
                behind = max(0, seq - state.issued.get(group, seq))
                lines.append(f"  {_where(state)}" + (f", {behind} collective(s) behind" if behind else ""))
        for rank in missing[:4]:
            lines += stack_of(rank)
        kind, culprits = "missing", missing
    elif len(signatures) > 1:
        groups = sorted(signatures.items(), key=lambda item: (len(item[1]), item[1]))
        fewest = len(groups[0][1])
        culprits = (
            sorted(r for _, ranks in groups if len(ranks) == fewest for r in ranks)
            if fewest < len(groups[-1][1])
            else sorted(joined)
        )
        lines = [
            f"desync: the ranks called different collectives as collective #{seq} of process group "
            f"{group.removeprefix('pg:')}, so each waits for a partner that never comes — rank(s) "
            f"{_ranks(culprits)} issued a different collective"
        ]
        for _, ranks in groups:
            w = joined[ranks[0]]
            lines.append(
                f"  rank(s) {_ranks(ranks)}: {_collective(w)}" + (f", issued at {w['site']}" if w.get("site") else "")
            )
        kind = "desync"
    elif silent or unreachable:
        # every other record unreachable: the store is gone, and with it rank 0, which hosts it (srun mode)
        culprits = silent or ([0] if len(unreachable) == len(states) - 1 and 0 in unreachable else unreachable)
        lines = [f"{head} — rank(s) {_ranks(culprits)} stopped responding"]
        for rank in silent:
            lines.append(f"  {_silent(alive[rank])}; last heard of at step {alive[rank].step}")
            lines += stack_of(rank)
        if unreachable and not silent:
            lines.append("  their records are unreachable: rank 0, which holds the job's store, may have died")
        kind = "unresponsive"
    else:
        culprits = []
        lines = [
            f"{head} — every rank is inside it and none is missing: the collective itself is stuck (the "
            "network, or a rank's device)"
        ]
        kind = "stuck"
    return Verdict(
        kind=kind, waiting=names, culprits=culprits, collective=_collective(entry), waited_s=waited, lines=lines
    )
