"""`trainscale profiles`: list the cluster profiles (built-in and user) or show one."""

from __future__ import annotations

from trainscale.errors import ConfigError


def _list() -> int:
    from trainscale.profiles import list_profiles, load_profile, user_profile_dir

    rows = []
    for source in list_profiles():
        origin = "built-in" if source.origin == "built-in" else f"user: {source.path}"
        try:
            p = load_profile(str(source.path))
            if p.extends:
                origin += f" (extends {p.extends})"
            elif source.overrides_builtin:
                origin += " (replaces built-in)"
            rows.append((source.name, origin, ",".join(p.partitions) or "-", str(p.gpus_per_node),
                         p.default_launcher, p.description))
        except ConfigError as exc:
            origin += " (replaces built-in)" if source.overrides_builtin else ""
            rows.append((source.name, origin, "?", "?", "?", f"BROKEN: {exc.message}"))
    headers = ("NAME", "SOURCE", "PARTITIONS", "GPUS/NODE", "LAUNCHER", "DESCRIPTION")
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers[:-1])]
    for row in (headers, *rows):
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])
    print(f"\nUser profiles: {user_profile_dir()}/NAME.toml (it replaces a built-in of the same name; "
          'with extends = "NAME" it changes only the keys it sets: docs/profiles.md).')
    print("Show one: trainscale profiles NAME    Binding plan: trainscale bind --profile NAME")
    return 0


def _show(name: str) -> int:
    import dataclasses

    from trainscale.profiles import load_profile
    from trainscale.topology import format_cpulist

    profile = load_profile(name)
    for f in dataclasses.fields(profile):
        value = getattr(profile, f.name)
        if f.name == "reserved_cores":
            value = format_cpulist(value) or "-"
        elif f.name == "gpu_cores":
            value = " ".join(f"{g}:{format_cpulist(c)}" for g, c in sorted(value.items())) or "-"
        elif f.name == "env":
            value = " ".join(f"{k}={v}" for k, v in value.items()) or "-"
        elif f.name == "container" and value is not None:
            value = " ".join([value.runtime, value.mode, *(f"-B {b}" for b in value.binds), *value.flags,
                              *(f"[setup: {line}]" for line in value.setup),
                              *([f"[modules: {'; '.join(value.modules) or 'none'}]"] if value.modules is not None else [])])
        elif isinstance(value, tuple):
            value = "; ".join(value) or "-"
        print(f"{f.name:<20} {value}")
    return 0


def run(args) -> int:
    return _show(args.name) if args.name else _list()


def register(sub) -> None:
    p = sub.add_parser("profiles", help="list cluster profiles (built-in and yours) or show one")
    p.add_argument("name", nargs="?", help="show this profile's settings")
    p.set_defaults(func=run)
