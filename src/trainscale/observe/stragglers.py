"""Stragglers named by arrival: a synchronous step makes every rank wait at its collectives (DDP's gradient
all-reduce; FSDP's all-gathers in forward and reduce-scatters; ZeRO's broadcasts) for the last one to arrive,
and all leave them together, so the rank that arrives last is the one that waits least there; its own time
(the step less those waits), split into the step's phases against the same split on the ranks that waited
for it, names the phase it lost its time in. No phase that accounts for most of it: "unexplained", never a
guessed cause. A cause is named only with its evidence (it waited for a CPU in the kernel's run queue; the
ranks' CPU bindings differ; a DataLoader fed the late phase), and the cost is the job's: the time every rank
waits for it.

Rank 0 looks in a side thread, reading the summaries the ranks publish to the store (observe/window.py) or,
without one, the ends of their record files; ``trainscale report`` reads the whole files
(:func:`diagnose`). Thresholds and evidence: docs/observability.md ("How a straggler is named").
"""

from __future__ import annotations

import json
import os
import statistics
import threading
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from trainscale.observe import place as places
from trainscale.observe.records import metrics_dir, note_event
from trainscale.observe.window import RankWindow, default_store, own_connection, own_time, phases, read_all

DEFAULT_SHARE = 0.1
"""A rank is a straggler when the others wait for it this share of the step or more, in two windows running."""
MIN_LATE_S = 0.002
"""Nor for less than this per step: a busy host's timer noise on millisecond steps (a rank's own threads, the
recorder's, the neighbours') shifts which rank arrives last by a fraction of a millisecond."""
RECURS = 2
"""Spikes in each of the two windows that make a hold-up in some steps only a recurring one (an evaluation every
N steps), not a burst."""
EXPLAINS = 0.5
"""A phase names the late rank's time when it holds at least this share of it; otherwise "unexplained"."""
PART, MOST = 0.3, 0.8
"""Two phases name it together (``forward+backward``) when the second holds ``PART`` of it and the two ``MOST``:
a block recomputed in backward under activation checkpointing runs its forward twice, once in each."""
INTERMITTENT = 0.6
"""A straggler by the medians that held the others up in at most this share of its last window's steps (those
every rank recorded) is late in some steps only: said so, with its means (the medians of two kinds of step
alternating fall between them: it was said to arrive last "each step"). A rank late in every step, by a few ms
on a loaded host, held them up in 3/4 of its steps by that count (3x the batch on one rank, load 9 on 2 cores)."""
ORDER = ("loader", "data", "forward", "between", "backward", "other", "optimizer")
"""The phases in the order a step runs them (how two named together are said)."""
LOADER_ADVICE = (
    "More DataLoader workers (num_workers, within the rank's CPUs), pinned memory or faster storage would feed it "
    "sooner"
)
DEFAULT_WINDOW = 20
MIN_WINDOW = 3
"""The fewest steps per window a report judges a short run by."""
PHASE_TEXT = {
    "loader": "fetching its batches from the DataLoader",
    "data": "host work between steps (after the optimizer step, before the forward)",
    "forward": "its forward",
    "between": "host work between forward and backward (the loss; a nanoGPT-style fetch of the next batch)",
    "backward": "its backward's computing",
    "optimizer": "its optimizer step",
    "other": "host work between backward and the optimizer step (clipping, logging)",
    "unexplained": "unexplained: no phase of its step accounts for it",
}


@dataclass(frozen=True)
class Straggler:
    rank: int
    host: str
    phase: str
    """A key of PHASE_TEXT: where its extra time went, or "unexplained"."""
    late_s: float
    """How much later than the others it arrives at the collective per step: what every other rank waits."""
    step_s: float
    """The job's median step."""
    mine_s: float
    others_s: float
    """The phase's median on the late rank and on the others (its own time where unexplained)."""
    cause: str = ""
    """Evidence of a cause, and what to do, or empty."""
    place: dict[str, Any] | None = None
    """Where in the user's code the phase's time goes, sampled on the late rank (observe/place.py), or None."""
    spikes: tuple[int, int] | None = None
    """Held up in some steps only: (in how many, of its last how many); its figures are then means per step."""

    @property
    def cost(self) -> float:
        """The share of the job's step it costs: without it the job would take this much less time."""
        return self.late_s / self.step_s if self.step_s > 0 else 0.0

    def describe(self) -> str:
        ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
        each = " a step on average" if self.spikes else ""
        where = (
            f"{phase_text(self.phase)} ({ms(self.mine_s)}{each} on it, {ms(self.others_s)} on the others)"
            if self.phase != "unexplained"
            else PHASE_TEXT[self.phase]
        )
        where += f"; {places.describe(self.place)}" if self.place else ""
        if self.spikes:
            held, of = self.spikes
            arrives = (
                f"takes longer in {held} of its last {of} steps, about {ms(self.late_s * of / max(held, 1))} "
                f"each, and the others wait for it ({ms(self.late_s)} per step on average)"
            )
            mean = " on average"
        else:
            arrives, mean = f"arrives last at the collectives, {ms(self.late_s)} after the others each step", ""
        return (
            f"rank {self.rank} on {self.host} {arrives}: {where}. Without it the job would take ~{self.cost:.0%} "
            f"less time: {ms(self.late_s)} of each {ms(self.step_s)} step{mean}"
            + (f". {self.cause}" if self.cause else "")
        )


def phase_text(phase: str) -> str:
    """What a straggler's phase (a key of PHASE_TEXT, or two joined by ``+``) is, in words."""
    return " and ".join(PHASE_TEXT[part] for part in phase.split("+"))


def _phase(mine: dict[str, float], others: dict[str, float], late_s: float) -> str:
    extra = {k: mine[k] - others.get(k, 0.0) for k in mine if k != "loader"}
    ranked = sorted(extra, key=extra.get, reverse=True)
    if not ranked:
        return "unexplained"
    two = len(ranked) > 1 and extra[ranked[1]] >= PART * late_s and sum(extra[p] for p in ranked[:2]) >= MOST * late_s
    named = ranked[:2] if two else ranked[:1]
    if not two and extra[named[0]] < EXPLAINS * late_s:
        return "unexplained"
    loader = mine.get("loader", 0.0) - others.get("loader", 0.0)
    if set(named) <= {"data", "between"} and loader >= EXPLAINS * sum(extra[p] for p in named):
        return "loader"  # the DataLoader's batches, in whichever of the two it ran
    return "+".join(p for p in ORDER if p in named)


def _cause(phase: str, mine: dict[str, Any], others: list[dict[str, Any]], late_s: float) -> str:
    """Only what a measurement shows: the late rank waited for a CPU (its run queue) for most of its lateness,
    its binding differs from the others', or a DataLoader is where its time went."""
    said = []
    if mine.get("cpu_wait") is not None and any(o.get("cpu_wait") is not None for o in others):
        wait, theirs = float(mine["cpu_wait"]), _noise(others)
        if wait - theirs >= EXPLAINS * late_s:
            said.append(
                f"It waited for a CPU {wait * 1e3:.1f} ms per step (ready to run while other work held its "
                f"cores: the kernel's run queue), the others {theirs * 1e3:.1f} ms: other work shares its cores"
            )
    cpus, cpus_o = len(mine.get("cpus") or []), statistics.median(len(o.get("cpus") or []) for o in others)
    if cpus and cpus_o and cpus < cpus_o:
        said.append(
            f"Its CPU binding has {cpus} CPU(s), the others' {cpus_o:g} (trainscale profiles --here shows the plan)"
        )
    node = [set(mine.get("cpus") or [])] + [
        set(o.get("cpus") or []) for o in others if o.get("node") == mine.get("node")
    ]
    overlap = [node[i] & set().union(*(n for j, n in enumerate(node) if j != i)) for i in range(len(node))]
    shared = overlap[0]
    if shared and not all(overlap[1:]):  # only where some rank of its node has CPUs of its own
        said.append(f"It shares CPU(s) {sorted(shared)[:8]} with another rank of its node, which the others do not")
    if phase == "loader":
        said.append(LOADER_ADVICE)
    return ". ".join(said)


def _noise(others: list[dict[str, Any]]) -> float:
    """How long the ranks that waited for the late one themselves waited for a CPU per step (their median; 0
    where the kernel does not say): on a host this busy, a lateness no longer than that is its jitter."""
    waits = [float(o["cpu_wait"]) for o in others if o.get("cpu_wait") is not None]
    return statistics.median(waits) if waits else 0.0


def find_in_windows(
    windows: dict[int, dict[str, Any]],
    *,
    share: float = DEFAULT_SHARE,
    window: int = DEFAULT_WINDOW,
    why: list[str] | None = None,
) -> Straggler | None:
    """Pure: from each rank's summary of its last two windows (observe/window.py), the rank that arrives last
    at the collective when the others wait for it ``share`` of the step or more, in the last window and the
    one before too (a passing hiccup, another job's burst on a shared core, is not a straggler). Linear in
    the ranks. The windows are the ranks' own (``w`` in a summary; ``window`` where a summary does not say).
    ``why``: where none is named, the rule that named none is appended to it (the diagnosis benchmark's)."""
    said = why.append if why is not None else lambda reason: None
    if len(windows) < 2 or any(
        w.get("n", 0) < 2 * w.get("w", window) or w.get("now") is None or w.get("before") is None
        for w in windows.values()
    ):
        said("fewer than two ranks with two full windows")
        return None
    found, reason = _named(windows, share, lambda w: w)
    if found is None and all((w.get("mean") or {}).get("before") is not None for w in windows.values()):
        # work that holds the others up in some steps only (an evaluation every 10 steps): the medians leave it
        # out, the means keep it; named where it recurs (two spikes or more in each window) in one phase
        found, by_means = _named(windows, share, lambda w: w["mean"], recurring=True)
        reason += f"; by the means, {by_means}" if by_means != reason else ""
    if found is None:
        said(reason)
    return found


def _named(
    windows: dict[int, dict[str, Any]], share: float, pick: Callable[[dict], dict], recurring: bool = False
) -> tuple[Straggler | None, str]:
    """The late rank by ``pick``'s figures of each summary (its medians, or its means with ``recurring``), or
    None and the rule that named none."""
    figures = {r: pick(w) for r, w in windows.items()}
    step = statistics.median(float(f.get("step") or 0.0) for f in figures.values())

    def latest(key: str) -> tuple[int, float]:
        own = {r: float(f[key]) for r, f in figures.items()}
        late = max(own, key=own.get)
        return late, own[late] - statistics.median(v for r, v in own.items() if r != late)

    (late, late_s), (before, before_s) = latest("now"), latest("before")
    if late != before or step <= 0 or min(late_s, before_s) < max(share * step, MIN_LATE_S):
        return None, (
            f"the latest rank changed between the windows ({before}, then {late})"
            if late != before
            else "no step time"
            if step <= 0
            else f"rank {late} late {min(late_s, before_s) * 1e3:.1f} ms, under the "
            f"{max(share * step, MIN_LATE_S) * 1e3:.1f} ms a straggler needs"
        )
    spiked = tuple(windows[late].get("spikes") or (0, 0))
    if recurring and min(spiked) < RECURS:
        return None, f"rank {late} late in {spiked} steps of its two windows, not recurring"
    some = None if recurring else _intermittent(windows, late, share)
    if some is not None:  # late in some of its steps only (a GAN's generator step, every other): its means
        figures = {r: w["mean"] for r, w in windows.items()}
        step = statistics.median(float(f.get("step") or 0.0) for f in figures.values())
        late_s = float(figures[late]["now"]) - statistics.median(
            float(f["now"]) for r, f in figures.items() if r != late
        )
        if late_s < max(share * step, MIN_LATE_S):
            return None, f"rank {late} late in some steps, {late_s * 1e3:.1f} ms on average, under a straggler's"
    others = [w for r, w in windows.items() if r != late]
    mine = figures[late].get("phases") or {}
    theirs = {
        k: statistics.median(float((figures[r].get("phases") or {}).get(k) or 0.0) for r in windows if r != late)
        for k in mine
    }
    phase = _phase(mine, theirs, late_s)
    if recurring and phase == "unexplained":
        return None, f"rank {late} late {late_s * 1e3:.1f} ms in some steps, in no one phase"
    if recurring and float(windows[late].get("cpu_wait") or 0.0) - _noise(others) >= EXPLAINS * late_s:
        # its steps wait for a CPU throughout (other work on its cores): contention, not work in some steps
        return None, f"rank {late} late {late_s * 1e3:.1f} ms in some steps, waiting for a CPU as long"
    cause = _cause(phase, windows[late], others, late_s)
    if phase == "unexplained" and not cause and _noise(others) >= late_s:
        # no phase, no evidence, and the others wait as long for a CPU: a busy host's jitter
        return None, f"rank {late} late {late_s * 1e3:.1f} ms, unexplained, the others' own wait for a CPU as long"
    mine_s, others_s = (
        (sum(mine[p] for p in phase.split("+")), sum(theirs[p] for p in phase.split("+")))
        if phase != "unexplained"
        else (figures[late]["now"], statistics.median(float(figures[r]["now"]) for r in windows if r != late))
    )
    straggler = Straggler(
        rank=late,
        host=windows[late].get("node") or "?",
        phase=phase,
        late_s=late_s,
        step_s=step,
        mine_s=mine_s,
        others_s=others_s,
        cause=cause,
        place=place_of(windows[late].get("place"), phase),
        spikes=(spiked[-1], int(windows[late].get("w") or 0)) if recurring else some,
    )
    return straggler, ""


def _intermittent(windows: dict[int, dict[str, Any]], late: int, share: float) -> tuple[int, int] | None:
    """(steps ``late`` held the others up in, steps of its last window every rank recorded) where that is
    :data:`INTERMITTENT` of them or fewer; else None (late throughout, or steps not numbered). A step it held them
    up in: it arrived last by a straggler's margin and by half its median lateness in such steps (a few ms on a
    tiny step of the other kind is not one)."""
    if any((w.get("mean") or {}).get("now") is None for w in windows.values()):
        return None
    own = _by_step({r: w.get("own") or [] for r, w in windows.items()})
    window = int(windows[late].get("w") or DEFAULT_WINDOW)
    aligned = list(_last_to_arrive(own))[-window:]  # the last window, which its means are of
    gaps = [gap for step, who, gap in aligned if who == late and gap >= _margin(own, step, share)]
    if len(aligned) < 2 * MIN_WINDOW or not gaps:
        return None
    n = sum(1 for gap in gaps if gap >= 0.5 * statistics.median(gaps))
    return (n, len(aligned)) if n <= INTERMITTENT * len(aligned) else None


def place_of(places: dict[str, Any] | None, phase: str) -> dict[str, Any] | None:
    """Where ``phase``'s time goes, of the places the late rank sampled (observe/place.py): of two phases named
    together, the clearer majority of its phase's samples (FSDP at 4 ranks on 2 cores: the checkpointed block in
    forward, where backward's were mostly its waits in ``loss.backward()``, the line the sampler named)."""
    found = [(places or {}).get(part) for part in phase.split("+")]
    return max((p for p in found if p), key=lambda p: (p.get("share", 0), p.get("samples", 0)), default=None)


def summarise(records: list[dict[str, Any]], window: int = DEFAULT_WINDOW) -> dict[str, Any]:
    """One rank's records (its meta record and steps, in order) as the summary it would publish."""
    summary = RankWindow(window, next((x for x in records if x.get("kind") == "meta"), {}))
    for record in records:
        if record.get("kind") == "step":
            summary.add(record)
        elif record.get("kind") == "place":
            summary.meta["place"] = record.get("places")
    return summary.summary()


def find_straggler(
    ranks: dict[int, list[dict]],
    *,
    share: float = DEFAULT_SHARE,
    window: int = DEFAULT_WINDOW,
    why: list[str] | None = None,
) -> Straggler | None:
    """Pure: :func:`find_in_windows` over each rank's records (its meta record and steps)."""
    summaries = {r: summarise(recs, window) for r, recs in ranks.items()}
    return find_in_windows(summaries, share=share, window=window, why=why)


@dataclass(frozen=True)
class Turns:
    """The ranks take turns arriving last: each step some rank holds the others up, no one rank most steps (a
    slow file system or another job's bursts hitting ranks at random). Read from the steps aligned by number."""

    late_s: float
    """How much later than the others' median the latest rank arrives, per step on average."""
    step_s: float
    """The job's mean step."""
    phase: str
    """Where the latest ranks' extra time went (a key of PHASE_TEXT)."""
    ranks: dict[int, int]
    """Rank -> the steps it arrived last in (those late by :data:`MIN_LATE_S` or more)."""
    steps: int
    cause: str = ""

    @property
    def cost(self) -> float:
        return self.late_s / self.step_s if self.step_s > 0 else 0.0

    def describe(self) -> str:
        ms = lambda s: f"{s * 1e3:.1f} ms"  # noqa: E731
        most = sorted(self.ranks.items(), key=lambda item: -item[1])
        who = ", ".join(f"rank {r} in {n}" for r, n in most[:4]) + (
            f" and {len(most) - 4} other rank(s)" if len(most) > 4 else ""
        )
        return (
            f"the ranks take turns holding the others up, no one rank most of the time: each step the last to "
            f"arrive at the collectives comes {ms(self.late_s)} after the others on average ({who} of "
            f"{self.steps} steps), its extra time in {phase_text(self.phase)}. Without it the job "
            f"would take ~{self.cost:.0%} less time: {ms(self.late_s)} of each {ms(self.step_s)} step on average"
            + (f". {self.cause}" if self.cause else "")
        )


ALONE = 0.8
"""A straggler holds at least this share of the time the others waited for the last rank, step by step (in
the steps some rank was late by :data:`MIN_LATE_S`); below it, the ranks take turns."""


def alone(held: dict[int, float], rank: int) -> bool:
    """Whether ``rank`` held the others up for most of the time they waited (:data:`ALONE`), ``held`` as
    :func:`turns` gives it; True where no step shows anyone late (no evidence against it: steps the ranks did
    not all record, or none late by a straggler's margin)."""
    total = sum(held.values())
    return total <= 0 or held.get(rank, 0.0) >= ALONE * total


def _last_to_arrive(own: dict[int, dict[int, float]]) -> Iterator[tuple[int, int, float]]:
    """(step, the rank that arrived last, how much later than the others' median) for each step every rank
    recorded: ``own`` is each rank's own time by step."""
    steps = set.intersection(*(set(times) for times in own.values())) if len(own) > 1 else set()
    for step in sorted(steps):
        times = {r: t[step] for r, t in own.items()}
        late = max(times, key=times.get)
        yield step, late, times[late] - statistics.median(v for r, v in times.items() if r != late)


def _margin(own: dict[int, dict[int, float]], step: int, share: float = DEFAULT_SHARE) -> float:
    """How late the last rank of ``step`` must be to count as holding the others up: a straggler's margin, a
    share of the ranks' median own time that step (a busy host's jitter on long steps is not a turn)."""
    return max(MIN_LATE_S, share * statistics.median(t[step] for t in own.values()))


def held(own: dict[int, list[list[float]]]) -> dict[int, float]:
    """How long each rank held the others up, step by step: ``own`` is each rank's [step, own time] pairs (its
    window summary's); the last to arrive by a straggler's margin (:func:`_margin`) holds them up its
    lateness."""
    return _held(_by_step(own))


def _by_step(own: dict[int, list[list[float]]]) -> dict[int, dict[int, float]]:
    """Each rank's [step, own time] pairs (its window summary's ``own``) as its own time by step."""
    return {r: {int(s): float(t) for s, t in pairs if s is not None and t is not None} for r, pairs in own.items()}


def _held(own: dict[int, dict[int, float]], share: float = DEFAULT_SHARE) -> dict[int, float]:
    """:func:`held` of each rank's own time by step; waits for a CPU count as lateness (a straggler's test)."""
    out: dict[int, float] = {}
    for step, late, gap in _last_to_arrive(own):
        if gap >= _margin(own, step, share):
            out[late] = out.get(late, 0.0) + gap
    return out


def turns(steps: dict[int, list[dict[str, Any]]], *, share: float = DEFAULT_SHARE) -> tuple[Turns | None, dict]:
    """Pure: every step the ranks all recorded, by its number: which rank arrived last and how much later than
    the others' median, and in which phase. Returns the turns (or None where one rank holds the others up most
    of the time, or the lateness is under a straggler's, or no one phase holds it), and how long each rank held
    the others up in all (:func:`held`)."""
    records = {
        r: {int(x["step"]): x for x in recs if x.get("step") is not None and own_time(x) is not None}
        for r, recs in steps.items()
    }
    own = {r: {step: own_time(x) for step, x in by_step.items()} for r, by_step in records.items()}
    count: dict[int, int] = {}
    held_s = _held(own, share)
    lateness, step_s, excess = [], [], {}
    for step, late, gap in _last_to_arrive(own):
        step_s.append(statistics.median(float(by_step[step]["step_s"]) for by_step in records.values()))
        if float(records[late][step].get("cpu_wait_s") or 0.0) >= EXPLAINS * gap:
            gap = 0.0  # it waited for a CPU that step (other work on its cores): a busy host's, not a turn
        lateness.append(gap)
        if gap >= _margin(own, step, share):
            count[late] = count.get(late, 0) + 1
            mine = phases(records[late][step])
            theirs = [phases(records[r][step]) for r in records if r != late]
            for k, v in mine.items():
                excess[k] = excess.get(k, 0.0) + v - statistics.median(t[k] for t in theirs)
    if not held_s:
        return None, held_s
    late_s, mean_step, n = statistics.fmean(lateness), statistics.fmean(step_s), len(lateness)
    if late_s < max(share * mean_step, MIN_LATE_S) or alone(held_s, max(held_s, key=held_s.get)):
        return None, held_s
    # each rank's typical step's wait, not its mean: one step's 1.4 s wait for a CPU in a loaded CI run made both
    # ranks' means 60 ms a step against their medians' 0.5-0.8 ms, and vetoed turns 39 ms late
    waits = [
        statistics.median(float(x.get("cpu_wait_s") or 0.0) for x in by_step.values()) for by_step in records.values()
    ]
    if statistics.median(waits) >= late_s:  # every rank waits as long for a CPU per step: a busy host's jitter
        return None, held_s
    phase = _phase({k: v / n for k, v in excess.items()}, {}, late_s)
    if phase == "unexplained":
        return None, held_s
    advice = LOADER_ADVICE if phase == "loader" else ""
    return Turns(late_s=late_s, step_s=mean_step, phase=phase, ranks=count, steps=n, cause=advice), held_s


@dataclass(frozen=True)
class Diagnosis:
    """What a report says of a finished run's steps (:func:`diagnose`)."""

    straggler: Straggler | None
    loader: bool
    """A DataLoader fed some rank: only then is a DataLoader advised on."""
    micro_batches: int | None
    """The lead module's forwards per optimizer step (the median), which its FLOPs and tokens count."""
    turns: Turns | None = None
    """No one straggler: the ranks take turns holding the others up (:func:`turns`)."""


def diagnose(ranks: dict[int, list[dict]], why: list[str] | None = None) -> Diagnosis:
    """Pure: a finished run's records, every step but the first (the start-up's) in two windows as long as the
    shortest rank's steps allow (``DEFAULT_WINDOW`` at most, ``MIN_WINDOW`` at least), then, where they name
    none, in its two halves; ``why`` as :func:`find_in_windows`'s."""
    steps = {r: [x for x in recs if x.get("kind") == "step"][1:] for r, recs in ranks.items()}
    halves = min((len(s) for s in steps.values()), default=0) // 2
    window = min(DEFAULT_WINDOW, halves)
    straggler = None
    if len(ranks) > 1 and window >= MIN_WINDOW:
        metas = {
            r: [x for x in recs if x.get("kind") == "meta"][:1] + [x for x in recs if x.get("kind") == "place"]
            for r, recs in ranks.items()
        }
        straggler = find_straggler({r: metas[r] + steps[r] for r in ranks}, window=window, why=why)
        if straggler is None and halves > window:  # the whole run in two halves: work every 100 steps, say
            window = halves
            straggler = find_straggler({r: metas[r] + steps[r] for r in ranks}, window=window, why=why)
    elif why is not None:
        why.append("one rank" if len(ranks) < 2 else f"too few steps for two windows of {MIN_WINDOW}")
    taking_turns = None
    if len(ranks) > 1 and window >= MIN_WINDOW:
        # the steps it was named from (a straggler of the last 40 steps need not be one of the whole run's)
        tail = {r: s[-2 * window :] for r, s in steps.items()} if straggler else steps
        taking_turns, last = turns(tail)
        if straggler is not None and not alone(last, straggler.rank):
            # the latest by its windows' figures, but the others waited for other ranks as much: no straggler
            if why is not None:
                share = last.get(straggler.rank, 0.0) / (sum(last.values()) or 1.0)
                why.append(f"rank {straggler.rank} held the others up {share:.0%} of the time only")
            straggler = None
        if straggler is not None:
            taking_turns = None
    micro = [int(x["micro_batches"]) for s in steps.values() for x in s if x.get("micro_batches")]
    return Diagnosis(
        straggler=straggler,
        loader=any("loader_s" in x for s in steps.values() for x in s),
        micro_batches=int(statistics.median(micro)) if micro else None,
        turns=taking_turns,
    )


class RankTail:
    """One rank's record file, read from where the last read stopped: its meta record and its last ``keep``
    steps with an own time. A line still being written is left for the next read. Never more than ``keep``
    lines' worth of bytes at a time: a watch that starts on a day-long run's files, or falls behind, skips
    to their ends (only the last two windows matter)."""

    LINE_BYTES = 2048
    """Generous for one step record (about 250 bytes)."""

    def __init__(self, path: Path, keep: int) -> None:
        self.path, self.offset, self.keep = path, 0, keep
        self.meta: dict[str, Any] | None = None
        self.steps: deque[dict[str, Any]] = deque(maxlen=keep)
        self.place: list[dict[str, Any]] = []

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                if self.meta is None and self.offset == 0:
                    self._take(fh.readline())
                    fh.seek(0)
                size = os.fstat(fh.fileno()).st_size
                budget = self.keep * self.LINE_BYTES
                if size - self.offset > budget:  # behind by more than the lines kept: only the last ones count
                    fh.seek(size - budget)
                    fh.readline()  # the cut line
                    self.offset = fh.tell()
                else:
                    fh.seek(self.offset)
                chunk = fh.read()
        except FileNotFoundError:
            chunk = b""
        complete = chunk.rfind(b"\n") + 1
        for line in chunk[:complete].splitlines():
            self._take(line)
        self.offset += complete
        return ([self.meta] if self.meta else []) + list(self.steps) + self.place

    def _take(self, line: bytes) -> None:
        try:
            record = json.loads(line)
        except ValueError:
            return
        if record.get("kind") == "meta":
            if self.meta is None:
                self.meta = record
        elif record.get("kind") == "step" and own_time(record) is not None:
            self.steps.append(record)
        elif record.get("kind") == "place":
            self.place = [record]


class StragglerWatch:
    """Rank 0's side thread: every ``every_s`` seconds, look at the ranks' last steps and name a straggler once.

    ``store``: where the ranks publish their summaries (observe/window.py); "auto" (default) is this
    process group's, when there is one of two or more ranks; None reads the record files in ``run_dir``."""

    def __init__(
        self,
        run_dir,
        *,
        say: Callable[[str], None],
        every_s: float = 10.0,
        share: float = DEFAULT_SHARE,
        window: int = DEFAULT_WINDOW,
        store: Any = "auto",
        world_size: int | None = None,
    ) -> None:
        self.run_dir, self.say, self.every_s = Path(run_dir), say, every_s
        self.share, self.window = share, window
        self.found: Straggler | None = None
        self.placed = False
        """The late rank published its places (none, perhaps, for the phase): nothing more to look for."""
        self.tails: dict[Path, RankTail] = {}
        if store == "auto":
            store = default_store()
            if store is not None:
                import torch.distributed as dist  # noqa: PLC0415 (job kit)

                world_size = dist.get_world_size()
                store = own_connection(store)
        self.store, self.world_size = store, world_size
        if store is not None and not world_size:
            raise ValueError("StragglerWatch: a store needs the world size")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="trainscale-stragglers", daemon=True)

    def start(self) -> StragglerWatch:
        self._thread.start()
        return self

    def windows(self) -> dict[int, dict[str, Any]] | None:
        """Every rank's summary of its last two windows: from the store, else from the record files."""
        if self.store is not None:
            try:
                return read_all(self.store, self.world_size)
            except Exception:  # the store went away (the run is ending): nothing more to say
                return None
        return {
            int(p.stem.split("-", 1)[1]): summarise(
                self.tails.setdefault(p, RankTail(p, 2 * self.window)).read(), self.window
            )
            for p in metrics_dir(self.run_dir).glob("rank-*.jsonl")
        }

    def check(self) -> Straggler | None:
        """Names a straggler once and flags its rank to sample its stack (observe/place.py); names it again,
        with its place, when the rank has published one for the phase."""
        if self.found is not None and (self.found.place or self.placed):
            return None
        windows = self.windows() or {}
        if self.found is not None:
            place = windows.get(self.found.rank, {}).get("place")
            self.placed = place is not None
            where = place_of(place, self.found.phase)
            if not where:
                return None
            found = replace(self.found, place=where)
        else:
            found = find_in_windows(windows, share=self.share, window=self.window) if windows else None
            owns = {r: w.get("own") or [] for r, w in windows.items()}
            shared = set.intersection(*(set(step for step, _ in pairs) for pairs in owns.values())) if owns else set()
            if found is not None and 0 < len(shared) < self.window:
                found = None  # too few steps every rank has published yet to tell a straggler from turns: next look
            elif found is not None and not alone(held(owns), found.rank):
                found = None  # the latest by its window's figures, but the ranks take turns (the report says so)
        if found is not None:
            self.found = found
            self.say(f"trainscale: straggler: {found.describe()}")
            note_event(
                self.run_dir,
                kind="straggler",
                rank=found.rank,
                host=found.host,
                phase=found.phase,
                cost=found.cost,
                place=found.place,
                message=found.describe(),
            )
            if not found.place:  # the late rank's thread samples its stack (observe/place.py)
                places.flag(self.run_dir, found.rank).touch()
        return found

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s) and not (self.found is not None and (self.found.place or self.placed)):
            self.check()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.every_s + 5)
