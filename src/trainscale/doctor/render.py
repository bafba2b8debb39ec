"""Turn findings into the paste-able text report, or JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from trainscale.doctor.finding import LEVELS, SECTIONS, Finding

TAGS = {"ok": "ok", "warning": "WARN", "error": "ERROR"}


@dataclass(frozen=True, kw_only=True)
class Report:
    """Everything one doctor run found."""

    host: str
    """Host name of the process that wrote the report (rank 0 under a launcher)."""
    created: str
    """UTC time, ISO 8601."""
    command: str
    """The command line that produced it."""
    findings: tuple[Finding, ...] = ()
    """In section order; network findings carry the rank that made them."""
    ranks_reporting: int = 1
    """How many ranks' findings are in the report."""

    def counts(self) -> dict[str, int]:
        return {level: sum(f.level == level for f in self.findings) for level in LEVELS}

    def to_dict(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "created": self.created,
            "command": self.command,
            "ranks_reporting": self.ranks_reporting,
            "counts": self.counts(),
            "findings": [f.to_dict() for f in self.findings],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Report:
        return cls(
            host=data["host"],
            created=data["created"],
            command=data["command"],
            ranks_reporting=data.get("ranks_reporting", 1),
            findings=tuple(Finding(**f) for f in data["findings"]),
        )


def render(report: Report, *, width: int = 22) -> str:
    """The text report: a header, one block per section, every warning/error with its hint, a summary line."""
    lines = [f"trainscale doctor report: host {report.host}, {report.created}", f"command: {report.command}"]
    for section in SECTIONS:
        found = [f for f in report.findings if f.section == section]
        if not found:
            continue
        lines += ["", f"== {section} =="]
        for f in sorted(found, key=lambda f: (f.rank is None, f.rank or 0)):
            name = f.check if f.rank is None else f"rank {f.rank} {f.check}"
            head, *more = f.message.splitlines() or [""]
            lines.append(f"[{TAGS[f.level]:<5}] {name:<{width}} {head}")
            lines += [f"{'':<{width + 9}}{line}" for line in more]
            if f.hint:
                lines.append(f"{'':<{width + 9}}hint: {f.hint}")
    counts = report.counts()
    lines += [
        "",
        f"Summary: {counts['ok']} ok, {counts['warning']} warning(s), {counts['error']} error(s)"
        + (f" from {report.ranks_reporting} rank(s)" if report.ranks_reporting > 1 else ""),
    ]
    problems = [f for f in report.findings if f.level != "ok"]
    for f in problems:
        where = "" if f.rank is None else f"rank {f.rank}: "
        lines.append(f"  {TAGS[f.level]}: {where}{f.check}: {f.hint}")
    return "\n".join(lines) + "\n"


def render_json(report: Report) -> str:
    return json.dumps(report.to_dict(), indent=2, sort_keys=False) + "\n"
