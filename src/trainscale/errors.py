"""Errors a user can cause, each naming what was seen, what was expected and how to fix it; and the
one writer of a rank's error file (torchelastic's format), which the launcher's summary reads.

Standard library only: the job kit (launch/kit.py) carries this module for the worker bootstrap.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
import traceback
from collections.abc import Callable, Mapping


class TrainscaleError(Exception):
    """Base class. ``str()`` gives the whole message: what was seen, what was expected, a hint."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(self.__str__())

    def __str__(self) -> str:
        return f"{self.message}\nHint: {self.hint}" if self.hint else self.message


class ConfigError(TrainscaleError):
    """A bad option, config file, profile or argument, caught before anything is launched."""


class MissingOption(ConfigError):
    """A required option was given by no source (command line, environment, config file, profile)."""

    def __init__(self, section: str, option: str, *, hint: str | None = None) -> None:
        self.section, self.option = section, option
        super().__init__(
            f"{section} option {option!r} is missing",
            hint=hint
            or f"give it on the command line, as TRAINSCALE_{section.upper()}_{option.upper()} "
            f"or in the [{section}] table of --config",
        )


class LaunchError(TrainscaleError):
    """The launch environment is inconsistent (ranks, ports, addresses, missing script)."""


class CheckpointError(TrainscaleError):
    """A checkpoint is missing, incomplete, corrupt, unsafe or incompatible."""


class SlurmError(TrainscaleError):
    """A SLURM command failed or a job ended in a state that is not COMPLETED."""


class RankFailed(TrainscaleError):
    """A rank of a launched function (``trainscale.launch``) or a submitted job (``trainscale.slurm``) raised:
    ``rank`` is the first that did (None when none recorded an exception), ``traceback`` its traceback as
    text; the rank's own exception is ``__cause__`` when it could be sent back."""

    def __init__(self, message: str, *, rank: int | None, traceback: str = "", hint: str | None = None) -> None:
        self.rank = rank
        self.traceback = traceback
        super().__init__(message, hint=hint)


def did_you_mean(value: str, valid: list[str] | tuple[str, ...]) -> str:
    """A hint listing the valid choices, closest first when one is close."""
    import difflib  # noqa: PLC0415 (job kit)

    close = difflib.get_close_matches(value, list(valid), n=1)
    listed = ", ".join(sorted(valid))
    return f"did you mean '{close[0]}'? Valid: {listed}" if close else f"valid choices: {listed}"


REFUSALS = ("ConfigError", "CheckpointError")
"""trainscale's errors that name a fix (a bad option, an unusable checkpoint): one line, like before launch.
Failures of the run itself (CollectiveTimeout naming a hung rank with its stack, RankFailed) keep theirs."""


HUNG_EXIT = 124
"""The exit status of a rank the hang watch ended, and of `trainscale run` whose root cause that hang is (as
``timeout(1)``'s): docs/errors.md, docs/reliability.md "Hangs"."""
PEER_CLOSED = ("Connection closed by peer", "Connection reset by peer")
"""How gloo reports that another rank's end closed the connection: that rank timed out, or died."""
PEER_GONE = (
    *PEER_CLOSED,
    "remote worker crashing",
    "Broken pipe",
    "got 0 bytes",
)  # c10d's store: "Failed to recv, got 0 bytes" when the rank hosting it is gone
"""Every report of a rank that only lost a peer: never a run's root cause (launch/summary.py)."""


def is_refusal(exc: BaseException) -> bool:
    """A trainscale refusal, known by its classes' module and names (a script in a stock container imports
    the image's own trainscale, whose classes are not this module's)."""
    return any(cls.__module__ == "trainscale.errors" and cls.__name__ in REFUSALS for cls in type(exc).__mro__)


def one_line(exc: BaseException) -> str:
    """``CheckpointError: what was seen (hint: the fix)`` on one line."""
    message, hint = getattr(exc, "message", str(exc)), getattr(exc, "hint", None)
    return f"{type(exc).__name__}: {message}" + (f" (hint: {hint})" if hint else "")


def succeeded(exc: SystemExit) -> bool:
    """``sys.exit()``, ``sys.exit(0)`` (and ``sys.exit(False)``): the interpreter's own exit status 0."""
    return exc.code is None or (isinstance(exc.code, int) and exc.code == 0)


_STARTED = time.time()
_RECORDED: list[BaseException] = []
"""The exception this process recorded (its stack grows as it unwinds: recorded again, it is rewritten)."""


ALSO_RECORD: list[Callable[[BaseException], None]] = []
"""Called first by :func:`record_error` with the exception: what else keeps a rank's error (a launched function's
runner: its record, with the exception itself, written before the group closes and the launcher may stop it)."""


def record_error(exc: BaseException, environ: Mapping[str, str] = os.environ, *, replace: bool = False) -> None:
    """Write ``exc`` to TORCHELASTIC_ERROR_FILE in torchelastic's format
    (``{"message": {"message", "extraInfo": {"py_callstack", "timestamp"}}}``), a refusal's one line in
    ``extraInfo.trainscale_error``. ``trainscale.init()``'s block records before it closes the process group
    (its peers fail the moment it does); the worker bootstrap records again after the script has unwound,
    rewriting the same exception with its whole stack. Any other record of this run is kept: the script's
    own ``@record``, or the error a script turned into ``sys.exit(1)``, is closer to the cause — except with
    ``replace``: a collective timeout the hang watch explained names the cause better than the script's record."""
    if isinstance(exc, SystemExit) and succeeded(exc):
        return
    for also in ALSO_RECORD:
        with contextlib.suppress(Exception):  # never hide the real error behind this one
            also(exc)
    path = environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    with contextlib.suppress(OSError):
        if not replace and os.path.getmtime(path) >= _STARTED - 1 and not (_RECORDED and _RECORDED[0] is exc):
            return
    extra = {
        "py_callstack": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "timestamp": str(int(time.time())),
    }
    if is_refusal(exc):
        extra["trainscale_error"] = one_line(exc)
    data = {"message": {"message": f"{type(exc).__name__}: {exc}", "extraInfo": extra}}
    partial = f"{path}.tmp{os.getpid()}"
    try:  # whole or not at all: the launcher may stop this rank mid-write, and it reads the file
        with open(partial, "w") as fh:
            json.dump(data, fh)
        os.replace(partial, path)
        _RECORDED[:] = [exc]
    except OSError as err:  # never hide the real error behind this one
        print(f"trainscale: could not write the error file {path}: {err}", file=sys.stderr)
