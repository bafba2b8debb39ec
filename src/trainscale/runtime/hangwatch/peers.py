"""The diagnosis of the first rank that timed out, passed to the others through the job's store.

That rank posts what it found: the names at once, then the message with the stacks (which come with the
culprits' heartbeat records: runtime/hangwatch/heartbeat.py). gloo closes that rank's connections when it times out, so
its peers fail at once with "Connection closed by peer"; they relay its diagnosis (:func:`await_diagnosis`)
rather than end first with a bare error while it still waits for the stacks — the launcher would then end it
before it could report, and nobody would name the hung rank.
"""

from __future__ import annotations

import time
from typing import Any

_NAMED, _DIAGNOSIS = "trainscale/hang/named", "trainscale/hang/diagnosis"
POLL_S = 0.05


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
