"""What ranks tell each other about a hang through the job's store: a hung rank's Python stack on
request, and the diagnosis of the first rank that timed out.

Stacks. 
The rank that times out cannot look into another process, possibly on another node. But the hung
rank's progress heartbeat (runtime/progress.py) still runs: on each beat it looks whether somebody
asked for its stack and, if so, writes its main thread's current stack (``sys._current_frames``)
to the store. The store is the one channel every rank shares on every launcher, across nodes;
``faulthandler`` on a signal would only reach ranks of one node.

Keys, per rank R: ``.../request/R`` counts requests (``add``), ``.../text/R`` holds the last stack,
``.../answered/R`` the number of requests answered. A requester adds 1 to the request count and
waits until the answered count reaches what it got back.

The diagnosis. The first rank to time out posts what it found: the names at once, then the message
with the stacks. gloo closes that rank's connections when it times out, so its peers fail at once with
"Connection closed by peer"; they relay its diagnosis (:func:`await_diagnosis`) rather than end first
with a bare error while it still waits for the stacks — the launcher would then end it before it
could report, and nobody would name the hung rank.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from typing import Any, Iterable

WAIT_S = 5.0
"""How long the noticing rank waits for the stacks: a few heartbeats, loaded machines included. A rank
whose Python holds the GIL forever (stuck in C code that never releases it) cannot answer."""
FRAMES = 12
"""Innermost frames kept: where it waits, and the few calls that led there."""
MAX_CHARS = 3000

_REQUEST, _TEXT, _ANSWERED = "trainscale/stack/request/{}", "trainscale/stack/text/{}", "trainscale/stack/answered/{}"
_NAMED, _DIAGNOSIS = "trainscale/hang/named", "trainscale/hang/diagnosis"
POLL_S = 0.05


def main_thread_stack() -> str:
    """The main thread's current Python stack, innermost last (as a traceback prints it)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return "(the main thread has no Python frame)"
    text = "".join(traceback.format_stack(frame)[-FRAMES:]).rstrip()
    return text if len(text) <= MAX_CHARS else "..." + text[-MAX_CHARS:]


def answer(store: Any, rank: int, answered: int) -> int:
    """One heartbeat's look: write this rank's stack if it was asked for since ``answered``; returns
    the number of requests answered now (pass it back next time)."""
    asked = store.add(_REQUEST.format(rank), 0)
    if asked <= answered:
        return answered
    store.set(_TEXT.format(rank), main_thread_stack())
    store.add(_ANSWERED.format(rank), asked - answered)  # only this rank writes it: it holds ``answered``
    return asked


def request(store: Any, ranks: Iterable[int], wait_s: float | None = None) -> dict[int, str | None]:
    """Ask ``ranks`` for their stacks and wait (at most ``wait_s``, default :data:`WAIT_S`) for their heartbeats
    to answer; rank -> stack text, None for a rank that did not answer in time."""
    wait_s = WAIT_S if wait_s is None else wait_s
    wanted = {rank: store.add(_REQUEST.format(rank), 1) for rank in ranks}
    out: dict[int, str | None] = {rank: None for rank in wanted}
    deadline = time.monotonic() + wait_s
    while wanted:
        for rank, ticket in list(wanted.items()):
            if store.add(_ANSWERED.format(rank), 0) >= ticket:
                out[rank] = store.get(_TEXT.format(rank)).decode(errors="replace")
                del wanted[rank]
        if not wanted or time.monotonic() >= deadline:
            break
        time.sleep(POLL_S)  # the answer comes with the peer's next heartbeat (every 0.5 s)
    return out


def post(store: Any, text: str, *, complete: bool) -> None:
    """Post this rank's diagnosis: the names (``complete=False``), then the whole message."""
    store.set(_DIAGNOSIS if complete else _NAMED, text)


def await_diagnosis(store: Any, wait_s: float) -> str | None:
    """The diagnosis a peer posted, waiting at most ``wait_s`` for the whole message (the names alone
    when only they came); None when no peer posted any (it crashed rather than timed out)."""
    names, deadline = None, time.monotonic() + wait_s
    while True:
        if store.check([_DIAGNOSIS]):
            return store.get(_DIAGNOSIS).decode(errors="replace")
        if names is None and store.check([_NAMED]):
            names = store.get(_NAMED).decode(errors="replace")
        if time.monotonic() >= deadline:
            return names
        time.sleep(POLL_S)
