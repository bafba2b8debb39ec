"""Zero code: what trainscale learns about any script (docs/observability.md), installed by the worker bootstrap
with one call (:func:`observe_when_torch_loads`). Standard library only until torch loads (the job kit holds it)."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
from collections.abc import MutableMapping
from typing import Any

RECORD_VAR, NOTICE_VAR = "TRAINSCALE_RECORD", "TRAINSCALE_HANG_NOTICE"
"""``0`` switches off the step records (observe/hooks.py), the hang watch (runtime/hangwatch/heartbeat.py)."""


def recording_on(environ: Any = os.environ) -> bool:
    return str(environ.get(RECORD_VAR, "1")).strip().lower() not in ("0", "false", "no", "off")


_OBSERVING: list = []
"""The recorder and the heartbeat's group watch, once the script imported torch."""


def observe_when_torch_loads(environ: MutableMapping[str, str] = os.environ, *, kit: str | None = None) -> None:
    """When the script imports torch (now if it has), the recorder's hooks go in (observe/hooks.py: every rank's
    steps, with a run directory) and a watch starts the rank's heartbeat once its process group exists
    (runtime/hangwatch/heartbeat.py: a hang's culprit named). torch's flight recorder keeps the last collectives
    (asked for
    before the group exists). Nothing here may fail the script: what cannot start says so in one line. ``kit``:
    the job kit's directory, where the script's Python has no trainscale of its own (a stock container)."""
    from trainscale.env import detect  # noqa: PLC0415 (job kit)

    run_dir = detect(environ).run_dir
    if observing(environ):
        when_imported("torch", lambda: _start_observing(environ, kit, run_dir, watch=_watching(environ)))


def observing(environ: Any = os.environ) -> bool:
    """Whether a rank started with ``environ`` records its steps (a run directory, records on) or watches for a
    hang (the notice on)."""
    from trainscale.env import detect  # noqa: PLC0415 (job kit)

    return bool(detect(environ).run_dir and recording_on(environ)) or _watching(environ)


def _watching(environ: Any) -> bool:
    return str(environ.get(NOTICE_VAR, "")).strip() not in ("0", "0.0")


def when_imported(name: str, then) -> None:
    """``then()`` once module ``name`` is imported: now if it is."""
    if name in sys.modules:
        then()
    else:
        sys.meta_path.insert(0, _AfterImport(name, then))


class _AfterImport:
    """A meta path finder that runs ``then`` right after module ``name`` has been imported (once)."""

    def __init__(self, name: str, then) -> None:
        self.name, self.then = name, then

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run, then = spec.loader.exec_module, self.then

        def exec_module(module):
            run(module)
            then()

        spec.loader.exec_module = exec_module
        return spec


def _start_observing(environ: MutableMapping[str, str], kit: str | None, run_dir: str | None, *, watch: bool) -> None:
    try:
        hooks, progress = _observers(kit)
        if watch:  # before the script's process group exists
            progress.ledger.enable_flight_recorder(environ)
            with contextlib.suppress(Exception):  # a desync's place is a nicety: records and the watch go on
                progress.ledger.record_sites()
        recorder = hooks.install(run_dir, environ=environ)  # None without a directory or with records off
        told = ((recorder.hang_noticed,), (recorder.flush,)) if recorder is not None else ((), ())  # a hang, a stall
        group_watch = progress.GroupWatch(environ, *told).start() if watch else None
        _OBSERVING[:] = [recorder, group_watch]
    except Exception as exc:  # an image's older torch, a module it lacks: the script runs on, unobserved
        print(
            f"trainscale: this rank is not observed (no step records or hang watch): {type(exc).__name__}: {exc}",
            file=sys.stderr,
            flush=True,
        )


OBSERVERS = (
    "trainscale.observe.hooks",
    "trainscale.runtime.hangwatch.heartbeat",
    "trainscale.observe.records",
    "trainscale.observe.sampler",
    "trainscale.observe.devices",
    "trainscale.observe.stragglers",
    "trainscale.observe.flops",
    "trainscale.runtime.memory",
    "trainscale.observe.state",
)
"""The recorder, the heartbeat, and every module they import later (the job kit holds them all)."""


def _observers(kit: str | None):
    """The recorder and heartbeat modules: from trainscale where the script's Python has it, else from the job
    kit (a stock container). The kit's copies stay loaded by their full names, which is how they import one
    another, but not the package itself: the script's ``import trainscale`` there still finds nothing."""
    try:
        own = importlib.util.find_spec("trainscale.observe") is not None
    except ModuleNotFoundError:  # no trainscale at all in this Python (a stock image)
        own = False
    if not kit or own:
        return importlib.import_module(OBSERVERS[0]), importlib.import_module(OBSERVERS[1])
    sys.path.insert(0, kit)
    try:
        for name in [n for n in sys.modules if n == "trainscale" or n.startswith("trainscale.")]:
            del sys.modules[name]  # an image's older trainscale without these modules
        loaded = [importlib.import_module(name) for name in OBSERVERS]
    finally:
        sys.path.remove(kit)
        sys.modules.pop("trainscale", None)
    return loaded[0], loaded[1]


def explain_hang(exc: BaseException) -> BaseException | None:
    """A collective timeout (or a peer's closed connection after one) as the heartbeat's verdict on who was
    missing, chained to ``exc``; None for anything else."""
    progress = sys.modules.get("trainscale.runtime.hangwatch.heartbeat")
    beat = progress.current() if progress is not None else None
    if beat is None or isinstance(exc, (KeyboardInterrupt, SystemExit)):
        return None
    try:  # a peer's closed connection is not waited on here: the launcher's summary names the rank that timed out
        explained = beat.watcher.explain(exc, relay=False)
    except Exception:
        return None
    if explained is None or explained is exc:
        return None
    explained.__cause__ = exc
    explained.__traceback__ = exc.__traceback__
    return explained


def stop_observing() -> None:
    """Before the worker ends: the recorder's last records and summary, then the heartbeat stopped (a thread
    left in a store call at interpreter shutdown aborts the process)."""
    observing, _OBSERVING[:] = list(_OBSERVING), []
    for part, stop in zip(observing, ("finish", "stop")):
        if part is not None:
            try:
                getattr(part, stop)()
            except Exception as exc:
                print(
                    f"trainscale: {stop} of the observation failed: {type(exc).__name__}: {exc}",
                    file=sys.stderr,
                    flush=True,
                )
