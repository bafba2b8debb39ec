"""What the doctor reports: one Finding (trainscale/findings.py) per check, grouped into named sections."""

from __future__ import annotations

from typing import Any

from trainscale.findings import Finding

LEVELS = ("ok", "warning", "error")

# Section titles, in report order. Every collect_* function files its findings under one of these.
VERSIONS = "Versions"
DEVICES = "Devices and topology"
LAUNCH = "Launch environment"
BINDING = "CPU binding"
THREADS = "Threads and DataLoader workers"
NETWORK = "Network (every rank)"
SECTIONS = (VERSIONS, DEVICES, LAUNCH, BINDING, THREADS, NETWORK)


def at_level(level: str):
    def make(section: str, check: str, message: str, hint: str = "", **detail: Any) -> Finding:
        return Finding(section=section, check=check, level=level, message=message, hint=hint, detail=detail)

    return make


ok, warning, error = at_level("ok"), at_level("warning"), at_level("error")
"""A finding of each level (a warning or an error without a hint is refused)."""
