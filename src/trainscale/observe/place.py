"""The place in the user's code where a late rank's time goes: its main thread's stack, sampled only once the
straggler watch (observe/stragglers.py) has named it, and only for a few seconds.

Every rank of two or more has a thread that looks for its flag file (``metrics/late-rank-<R>``, written by the
watch) every ``POLL_S``: nothing runs in its steps. Once flagged it takes ``SAMPLES`` samples of the main
thread's stack, one every ``EVERY_S``, each the innermost frame of the user's code (not the standard library's,
nor an installed package's, torch's or trainscale's) with the phase the rank was in (the step's last mark:
observe/steps.py), and writes a ``place`` record with the place of each phase that has one: the function that
holds ``MAJORITY`` of that phase's samples or more (``MIN_SAMPLES`` at least), with its most sampled line.
No clear majority: no place. docs/observability.md ("How a straggler is named").
"""

from __future__ import annotations

import os
import sys
import sysconfig
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from trainscale.observe.records import metrics_dir

POLL_S, EVERY_S, SAMPLES = 1.0, 0.005, 300
MAJORITY, MIN_SAMPLES = 0.6, 20
AFTER = {
    "start": "data",
    "data": "forward",
    "forward": "between",
    "between": "backward",
    "backward": "sync",
    "sync": "other",
    "other": "optimizer",
    "optimizer": "data",
}
"""A step's last mark -> the phase the rank is in since."""
GROUPS = {"loader": ("data", "between"), "unexplained": None}
"""A straggler's phase whose samples are those of several phases (None: all)."""
Site = tuple  # (function, file, line)


def flag(run_dir: str | Path, rank: int) -> Path:
    return metrics_dir(run_dir) / f"late-rank-{rank}"


def not_users() -> tuple[str, ...]:
    """Folders whose code is not the user's: the standard library, installed packages, torch, trainscale."""
    import torch  # noqa: PLC0415 (job kit)

    paths = [sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")]
    paths += [os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__))]  # trainscale's
    return tuple(os.path.join(os.path.realpath(p), "") for p in paths)


def user_site(frame: Any, excluded: tuple[str, ...], known: dict[str, bool] | None = None) -> Site | None:
    """Pure: the innermost frame of the user's code from ``frame`` outwards, as (function, file, line)."""
    known = {} if known is None else known
    while frame is not None:
        path = frame.f_code.co_filename
        if path not in known:
            known[path] = not path.startswith("<") and not os.path.realpath(path).startswith(excluded)
        if known[path]:
            name = getattr(frame.f_code, "co_qualname", frame.f_code.co_name).replace("<locals>.", "")
            return name, path, frame.f_lineno
        frame = frame.f_back
    return None


def choose(samples: list[tuple[str, Site | None]], phase: str) -> dict[str, Any] | None:
    """Pure: of (phase, site) samples, the place of ``phase``'s: the function of a clear majority of them."""
    wanted = GROUPS.get(phase, (phase,))
    sites = [site for at, site in samples if wanted is None or at in wanted]
    counts = Counter(site[:2] for site in sites if site)
    if len(sites) < MIN_SAMPLES or not counts:
        return None
    (function, path), n = counts.most_common(1)[0]
    if n < MAJORITY * len(sites):
        return None
    line = Counter(s[2] for s in sites if s and s[:2] == (function, path)).most_common(1)[0][0]
    return {"function": function, "file": path, "line": line, "share": round(n / len(sites), 2), "samples": len(sites)}


def describe(place: dict[str, Any]) -> str:
    return (
        f"its time goes in `{place['function']}` ({place['file']}:{place['line']}): {place['share']:.0%} of "
        f"{place['samples']} samples of its stack there"
    )


class StackSampler:
    """A rank's thread: waits for its flag, then samples its main thread and hands the places to ``recorder``
    (observe/hooks.py): a ``place`` record in its file, and in the summary it publishes."""

    def __init__(self, recorder: Any, rank: int) -> None:
        self.recorder, self.flag = recorder, flag(recorder.run_dir, rank)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="trainscale-place", daemon=True)

    def start(self) -> StackSampler:
        self._thread.start()
        return self

    def _phase(self) -> str:
        marks = getattr(self.recorder.marks, "_marks", None)
        try:  # the training thread replaces the list's contents at a step's end
            return AFTER.get(marks[-1][0] if marks else "start", "data")
        except IndexError:
            return "data"

    def _run(self) -> None:
        while not self.flag.exists():
            if self._stop.wait(POLL_S):
                return
        main, excluded, known = threading.main_thread().ident, not_users(), {}
        cwd = os.path.join(os.getcwd(), "")
        samples: list[tuple[str, Site | None]] = []
        while len(samples) < SAMPLES and not self._stop.wait(EVERY_S):
            frame = sys._current_frames().get(main)
            if frame is None:
                return
            site = user_site(frame, excluded, known)
            samples.append((self._phase(), site and (site[0], site[1].removeprefix(cwd), site[2])))
            del frame
        places = {p: c for p in {*AFTER.values(), *GROUPS} if (c := choose(samples, p))}
        out = self.recorder.out
        if out is not None:
            out.out.write({"kind": "place", "t": time.time(), "samples": len(samples), "places": places})
            out.window.meta["place"] = places  # into the summary the watch reads from the store

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)
