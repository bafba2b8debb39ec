"""`trainscale profiles`: the table of every profile (built-in and the user's) and one profile's settings."""

from __future__ import annotations

import dataclasses

from trainscale.errors import ConfigError
from trainscale.profiles.loader import list_profiles, load_profile
from trainscale.topology.cpulist import format_cpulist


def table() -> list[str]:
    """A line per profile (a broken user profile says why), aligned, the description last."""
    rows = []
    for source in list_profiles():
        origin = "built-in" if source.origin == "built-in" else f"user: {source.path}"
        try:
            p = load_profile(str(source.path))
            if p.extends:
                origin += f" (extends {p.extends})"
            elif source.overrides_builtin:
                origin += " (replaces built-in)"
            rows.append(
                (
                    source.name,
                    origin,
                    ",".join(p.partitions) or "-",
                    str(p.gpus_per_node),
                    p.default_launcher,
                    p.description,
                )
            )
        except ConfigError as exc:
            origin += " (replaces built-in)" if source.overrides_builtin else ""
            rows.append((source.name, origin, "?", "?", "?", f"BROKEN: {exc.message}"))
    headers = ("NAME", "SOURCE", "PARTITIONS", "GPUS/NODE", "LAUNCHER", "DESCRIPTION")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers[:-1])]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1] for row in (headers, *rows)]


def settings(name: str) -> list[str]:
    """Every field of one profile, a line each, as the TOML would say it in short."""
    profile = load_profile(name)
    lines = []
    for f in dataclasses.fields(profile):
        value = getattr(profile, f.name)
        if f.name == "reserved_cores":
            value = format_cpulist(value) or "-"
        elif f.name == "gpu_cores":
            value = " ".join(f"{g}:{format_cpulist(c)}" for g, c in sorted(value.items())) or "-"
        elif f.name == "env":
            value = " ".join(f"{k}={v}" for k, v in value.items()) or "-"
        elif f.name == "container" and value is not None:
            value = " ".join(
                [
                    value.runtime,
                    value.mode,
                    *(f"-B {b}" for b in value.binds),
                    *value.flags,
                    *(f"[setup: {line}]" for line in value.setup),
                    *([f"[modules: {'; '.join(value.modules) or 'none'}]"] if value.modules is not None else []),
                ]
            )
        elif isinstance(value, tuple):
            value = "; ".join(value) or "-"
        lines.append(f"{f.name:<20} {value}")
    return lines
