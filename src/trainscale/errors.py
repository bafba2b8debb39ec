"""Errors a user can cause, each naming what was seen, what was expected and how to fix it."""

from __future__ import annotations


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
        super().__init__(f"{section} option {option!r} is missing",
                         hint=hint or f"give it on the command line, as TRAINSCALE_{section.upper()}_{option.upper()} "
                                      f"or in the [{section}] table of --config")


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
    import difflib

    close = difflib.get_close_matches(value, list(valid), n=1)
    listed = ", ".join(sorted(valid))
    return f"did you mean '{close[0]}'? Valid: {listed}" if close else f"valid choices: {listed}"
