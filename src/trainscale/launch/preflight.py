"""Checks of a user script's own arguments that trainscale can make before any process starts."""

from __future__ import annotations


def option_value(args: list[str] | tuple[str, ...], *names: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` among a script's arguments (last one wins)."""
    found = None
    for i, arg in enumerate(args):
        for name in names:
            if arg == name and i + 1 < len(args):
                found = args[i + 1]
            elif arg.startswith(name + "="):
                found = arg.split("=", 1)[1]
    return found


def check_script_args(args: list[str] | tuple[str, ...], world_size: int, *, device: str | None = None) -> None:
    """A script's ``--deepspeed_config FILE`` (DeepSpeed's own argument) is read as DeepSpeed reads it
    and its batch arithmetic checked against the world size; raises ConfigError with the fix."""
    path = option_value(args, "--deepspeed_config", "--deepspeed-config")
    if path is None:
        return
    from trainscale.strategies.ds_config import check_user_config_file  # noqa: PLC0415 (torch-free module)

    check_user_config_file(path, world_size, device=device)
