"""One string -> field type converter for every place a user types a dataclass field as text: a
``TRAINSCALE_<SECTION>_<FIELD>`` variable (config/) and a ``--strategy name:key=value`` option
(strategies/). Only the separator between several values differs: a strategy spec already uses ``,``
between its options, so there several values are joined with ``+`` (``fsdp:unit_modules=Block+Head``).
Layer 0, so that both can use it; the callers turn a ValueError into their own one-line error.
"""

from __future__ import annotations

import types
import typing
from typing import Any

NONE_WORDS = ("", "none", "null")
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def kinds(annotation: Any) -> tuple[Any, ...]:
    """The types a field takes, in its declared order, None left out (``float | str`` -> (float, str))."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(a for a in typing.get_args(annotation) if a is not type(None))
    return (annotation,)


def optional(annotation: Any) -> bool:
    return type(None) in typing.get_args(annotation) or annotation is type(None)


def convert(text: str, annotation: Any, *, sep: str = ",") -> Any:
    """``text`` as a value of ``annotation``: the first of its types that takes it (``float | str``: a
    number where it is one, else the word); None for ``none``/``null``/empty where the field allows None.
    Several values (a tuple, a list, a dict's KEY=VALUE pairs) are separated by ``sep``; items stay strings.
    Raises ValueError when no type takes it."""
    if optional(annotation) and text.strip().lower() in NONE_WORDS:
        return None
    for kind in kinds(annotation):
        try:
            return _one(text, kind, sep)
        except ValueError:
            continue
    raise ValueError(text)


def _one(text: str, kind: Any, sep: str) -> Any:
    origin = typing.get_origin(kind) or kind
    if kind is bool:
        lowered = text.strip().lower()
        if lowered not in TRUE_WORDS + FALSE_WORDS:
            raise ValueError(text)
        return lowered in TRUE_WORDS
    if kind in (int, float, str):
        return kind(text)
    if origin in (tuple, list):
        items = [x.strip() for x in text.split(sep) if x.strip()]
        return tuple(items) if origin is tuple else items
    if origin is dict:  # KEY=VALUE<sep>KEY=VALUE
        pairs = [x.split("=", 1) for x in text.split(sep) if x.strip()]
        if any(len(p) != 2 or not p[0].strip() for p in pairs):
            raise ValueError(text)
        return {k.strip(): v for k, v in pairs}
    return text  # a type this module does not know: the dataclass validates the string


__all__ = ["convert", "kinds", "optional"]
