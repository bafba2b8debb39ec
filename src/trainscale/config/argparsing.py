"""argparse as trainscale's commands use it: a mistake on the command line is one line and a hint, like every
other refusal (docs/errors.md), not 10-26 lines of usage above it; the usage is ``--help``'s.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are ``PROG: error: MESSAGE`` and ``Hint: ...`` (exit 2). ``hint``: the
    fix for a given message, or None for the default (``PROG --help`` lists the options). Its subparsers are
    Parsers too (argparse makes them of the parent's class)."""

    def __init__(self, *args, hint: Callable[[str], str | None] | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hint = hint

    def error(self, message: str) -> NoReturn:
        hint = (self.hint(message) if self.hint else None) or f"`{self.prog} --help` lists its options"
        self.exit(2, f"{self.prog}: error: {message}\nHint: {hint}\n")


def unrecognized(message: str) -> list[str]:
    """The option names argparse did not recognise, from its message."""
    if not message.startswith("unrecognized arguments:"):
        return []
    return [word.split("=", 1)[0] for word in message.split(":", 1)[1].split() if word.startswith("-")]
