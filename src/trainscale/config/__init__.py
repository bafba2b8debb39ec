"""One resolution order for every configuration dataclass.

    dataclass defaults < cluster profile < config file < environment < command line

Each source is a plain mapping of field name -> value; the config file is TOML (one table per
section, e.g. ``[slurm]`` or ``[train]``), the environment is ``TRAINSCALE_<SECTION>_<FIELD>``.
``resolve`` returns the validated dataclass and where each non-default value came from.

The cluster profile is not a mapping passed here: a SLURM job spec leaves a field None ("the
profile's") and the profile fills exactly those when the job's plan is derived
(``launch/slurm/spec.py`` ``resolve``), which puts it above the defaults and below every source by
construction. Its values cannot be a layer here because some of them go with what a source chose
(the profile's memory per GPU gives way to ``--mem``). The profile's *name* resolves here, as any option.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import os
import re
import sys
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from trainscale.convert import convert, kinds
from trainscale.errors import ConfigError, MissingOption, did_you_mean

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

T = TypeVar("T")
ORDER = ("default", "profile", "config file", "environment", "command line")


def read_toml(path: str | Path, what: str, missing: str, invalid: str = "check the line named above") -> dict[str, Any]:
    """A TOML file's tables; a missing or invalid file is a ConfigError naming ``what`` with the hint for it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{what} {path} does not exist", hint=missing)
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{what} {path} is not valid TOML: {exc}", hint=invalid) from None
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}", hint="check its permissions") from None


def load_config_file(path: str | Path) -> dict[str, Any]:
    return read_toml(path, "config file", "give the path of a TOML file, e.g. --config job.toml")


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init and not f.name.startswith("_")}


def _coerce(name: str, text: str, annotation: Any, source: str) -> Any:
    """Turn an environment string into the field's type (several values: comma-separated)."""
    try:
        return convert(text, annotation, sep=",")
    except ValueError:
        first = kinds(annotation)[0]
        kind = "KEY=VALUE,..." if (typing.get_origin(first) or first) is dict else getattr(first, "__name__", first)
        raise ConfigError(f"{source}: {name}={text!r} is not a valid {kind}", hint=f"give {name} as a {kind}") from None


def field_docs(cls: type) -> dict[str, str]:
    """Each field's docstring (the string literal under it, as this project documents every field), for
    ``--help``: the dataclass stays the one place an option is described. Python's ``None`` there is, on
    the command line, the option not given."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        body = ast.parse(inspect.getsource(klass).lstrip()).body[0].body
        for node, after in zip(body, body[1:]):
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant)
                and isinstance(after.value.value, str)
            ):
                text = " ".join(after.value.value.split())
                docs[node.target.id] = _NONE.sub(
                    lambda m: "(not given)" if m.group(0) == "(None)" else "not given:", text
                )
    return docs


_NONE = re.compile(r"\(None\)|\bNone:")


def from_environment(
    cls: type | tuple[type, ...], section: str, environ: Mapping[str, str] | None = None
) -> dict[str, Any]:
    environ = os.environ if environ is None else environ
    prefix = f"TRAINSCALE_{section.upper()}_"
    types_ = _group_types(cls if isinstance(cls, tuple) else (cls,))
    out = {}
    for key, text in environ.items():
        if not key.startswith(prefix):
            continue
        name = key[len(prefix) :].lower()
        if name not in types_:
            raise ConfigError(
                f"environment variable {key} names no {section} option", hint=did_you_mean(name, list(types_))
            )
        out[name] = _coerce(name, text, types_[name], f"environment {key}")
    return out


def _group_types(classes: tuple[type, ...]) -> dict[str, Any]:
    """The fields of dataclasses that share one section; a name in two of them would be ambiguous."""
    types_: dict[str, Any] = {}
    for cls in classes:
        for name, annotation in _field_types(cls).items():
            if name in types_:
                raise TypeError(f"{cls.__name__}.{name} is also a field of another class in this section")
            types_[name] = annotation
    return types_


def resolve(
    cls: type[T],
    *,
    section: str,
    defaults: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    cli: Mapping[str, Any] | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> tuple[T, dict[str, str]]:
    """Build ``cls`` from the sources in ORDER (the profile aside, see above); ``cli`` holds only options the
    user actually gave. ``fixed``: fields the command decides itself (a positional SCRIPT, a detected GPU
    count), passed as they are; no source may name them."""
    (built,), origin = resolve_group(
        (cls,), section=section, defaults=defaults, config=config, environ=environ, cli=cli, fixed=fixed
    )
    return built, origin


def resolve_group(
    classes: tuple[type, ...],
    *,
    section: str,
    defaults: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    cli: Mapping[str, Any] | None = None,
    fixed: Mapping[str, Any] | None = None,
) -> tuple[tuple[Any, ...], dict[str, str]]:
    """:func:`resolve` for dataclasses that share one section (a workload's own options beside
    ``TrainOptions`` in ``[train]``): each source may hold any of their fields, a name none of them has is
    refused, and each class is built from its own fields."""
    fixed = dict(fixed or {})
    valid = {name: kind for name, kind in _group_types(classes).items() if name not in fixed}
    table = dict((config or {}).get(section, {})) if config is not None else {}
    layers = [
        ("default", dict(defaults or {})),
        ("config file", table),
        ("environment", from_environment(classes, section, environ)),
        ("command line", {k: v for k, v in (cli or {}).items() if v is not None}),
    ]
    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for source, values in layers:
        for key, value in values.items():
            if key not in valid:
                raise ConfigError(f"{source}: unknown {section} option {key!r}", hint=did_you_mean(key, list(valid)))
            merged[key] = tuple(value) if isinstance(value, list) and typing.get_origin(valid[key]) is tuple else value
            if source == "default":
                origin.pop(key, None)
            else:
                origin[key] = source
    return tuple(_build(cls, section, {**merged, **fixed}) for cls in classes), origin


def _build(cls: type, section: str, merged: Mapping[str, Any]) -> Any:
    mine = {name: merged[name] for name in _field_types(cls) if name in merged}
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.init
        and f.name not in mine
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise MissingOption(section, missing[0])
    try:
        return cls(**mine)
    except TypeError as exc:
        raise ConfigError(f"{section} options: {exc}", hint="check the types in your config file") from None


__all__ = ["ORDER", "resolve", "resolve_group", "load_config_file", "from_environment", "field_docs"]
