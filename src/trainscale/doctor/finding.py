"""What the doctor reports: one Finding per check, grouped into named sections."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from trainscale.errors import ConfigError

LEVELS = ("ok", "warning", "error")

# Section titles, in report order. Every collect_* function files its findings under one of these.
VERSIONS = "Versions"
DEVICES = "Devices and topology"
LAUNCH = "Launch environment"
BINDING = "CPU binding"
THREADS = "Threads and DataLoader workers"
NETWORK = "Network (every rank)"
SECTIONS = (VERSIONS, DEVICES, LAUNCH, BINDING, THREADS, NETWORK)


@dataclass(frozen=True, kw_only=True)
class Finding:
    """One line of the report: what was checked, what was seen, how worried to be, and what to do."""

    section: str
    """One of SECTIONS."""
    check: str
    """Short name of what was checked (``torch``, ``OMP_NUM_THREADS``, ``all-reduce``)."""
    level: str
    """ok, warning or error."""
    message: str
    """What was seen, with the numbers."""
    hint: str = ""
    """What to do about it (always given for warnings and errors)."""
    rank: int | None = None
    """Global rank that made this finding; None for this process's own report."""
    detail: dict[str, Any] = field(default_factory=dict)
    """Machine-readable values behind the message (for ``--json``)."""

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ConfigError(f"finding level {self.level!r} is not one of {', '.join(LEVELS)}",
                              hint="use ok, warning or error")
        if self.level != "ok" and not self.hint:
            raise ConfigError(f"{self.level} finding {self.check!r} has no hint",
                              hint="every warning and error says what to do about it")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def at_level(level: str):
    def make(section: str, check: str, message: str, hint: str = "", **detail: Any) -> Finding:
        return Finding(section=section, check=check, level=level, message=message, hint=hint, detail=detail)
    return make


ok, warning, error = at_level("ok"), at_level("warning"), at_level("error")
"""A finding of each level (a warning or an error without a hint is refused)."""
