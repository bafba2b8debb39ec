"""`trainscale profiles`: list the cluster profiles (built-in and user) or show one."""

from __future__ import annotations


def run(args) -> int:
    from trainscale.profiles import user_profile_dir
    from trainscale.profiles.listing import settings, table

    if args.name:
        print("\n".join(settings(args.name)))
        return 0
    print("\n".join(table()))
    print(f"\nUser profiles: {user_profile_dir()}/NAME.toml (it replaces a built-in of the same name; "
          'with extends = "NAME" it changes only the keys it sets: docs/profiles.md).')
    print("Show one: trainscale profiles NAME    Binding plan: trainscale bind --profile NAME")
    return 0


def register(sub) -> None:
    p = sub.add_parser("profiles", help="list cluster profiles (built-in and yours) or show one")
    p.add_argument("name", nargs="?", help="show this profile's settings")
    p.set_defaults(func=run)
