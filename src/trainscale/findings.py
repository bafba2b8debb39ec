"""One finding of a check: how worried to be, what was seen, what to do. The doctor, the job lint and the
report's verdict all say what they found with it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from trainscale.errors import ConfigError

LEVELS = ("error", "warning", "note", "ok", "problem", "good")
"""lint: error/warning/note; doctor: ok/warning/error; report: problem/note/good."""


@dataclass(frozen=True)
class Finding:
    level: str
    """One of LEVELS."""
    message: str
    """What was seen, with the numbers."""
    hint: str = ""
    """What to do about it (always given for a warning or an error)."""
    section: str = ""
    """The doctor's section (doctor/finding.py SECTIONS)."""
    check: str = ""
    """The doctor's short name of what was checked (``torch``, ``OMP_NUM_THREADS``)."""
    rank: int | None = None
    """Global rank that made this finding; None for this process's own."""
    detail: dict[str, Any] = field(default_factory=dict)
    """Machine-readable values behind the message (for ``--json``)."""

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ConfigError(
                f"finding level {self.level!r} is not one of {', '.join(LEVELS)}", hint="use ok, warning or error"
            )
        if self.level in ("warning", "error") and not self.hint:
            raise ConfigError(
                f"{self.level} finding {self.check or self.message!r} has no hint",
                hint="every warning and error says what to do about it",
            )

    def __str__(self) -> str:
        return f"{self.level}: {self.message}\n  hint: {self.hint}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
