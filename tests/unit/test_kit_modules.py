"""The job kit carries every trainscale module its own modules import (a module left out fails only in a stock
container, where the kit is all of trainscale there is)."""

from __future__ import annotations

import ast

from trainscale.launch.kit import MODULES, PACKAGE

FACADES = {"__init__.py", "launch/__init__.py", "runtime/__init__.py"}
"""Package facades whose lazy attributes (trainscale.init, trainscale.launch(fn), runtime.init) a rank in a
container never asks for."""


def _imported(rel: str) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse((PACKAGE / rel).read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trainscale"):
            names |= {node.module, *(f"{node.module}.{a.name}" for a in node.names)}
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("trainscale")}
    return names


def _files(name: str) -> list[str]:
    parts = name.split(".")[1:]
    found = ["/".join(parts) + ".py", "/".join([*parts, "__init__.py"])] if parts else ["__init__.py"]
    return [f for f in found if (PACKAGE / f).exists()]


def test_every_module_a_kit_module_imports_is_in_the_kit():
    missing = {
        rel: sorted(n for n in _imported(rel) if _files(n) and not set(_files(n)) & set(MODULES))
        for rel in MODULES
        if rel not in FACADES
    }
    assert {rel: names for rel, names in missing.items() if names} == {}
