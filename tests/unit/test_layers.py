"""The dependency rule of docs/architecture.md: each layer imports only itself and the layers below it,
and no modules import each other in a cycle. Lazy imports inside functions count, and so do
``from trainscale import x`` (x a subpackage: x's layer; anything else: the facade's) and relative imports."""

from __future__ import annotations

import ast
from pathlib import Path

import trainscale

PACKAGE = Path(trainscale.__file__).parent
LAYERS = {
    "errors": 0,
    "findings": 0,
    "_version": 0,
    "convert": 0,
    "__main__": 7,
    "env": 1,
    "topology": 2,
    "runtime": 3,
    "strategies": 4,
    "data": 4,
    "checkpoint": 4,
    "observe": 4,
    "launch": 5,
    "profiles": 5,
    "config": 5,
    "train": 5,
    "slurm": 5,
    "bench": 6,
    "plan": 6,
    "selftest": 6,
    "doctor": 6,
    "workloads": 6,
    "report": 6,
    "cli": 7,
}
FACADE = 5
"""``trainscale/__init__.py``: ``trainscale.init`` is train/session.py's, so importing the facade is
importing layer 5, and the facade itself may reach no higher."""


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package at ``root``."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package's modules that ``name`` imports, module-level or lazy, resolved to the module each
    names: ``from pkg import sub`` is ``pkg.sub`` when that is a module, else ``pkg``."""
    top = name.split(".")[0]
    here = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets |= {_owner(alias.name, known) for alias in node.names if alias.name.split(".")[0] == top}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from its own package upwards
                anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != top:
                continue
            for alias in node.names:
                full = f"{base}.{alias.name}"
                targets.add(full if full in known else _owner(base, known))
    targets.discard(None)
    return targets


def _owner(dotted: str, known: dict[str, Path]) -> str | None:
    while dotted and dotted not in known:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def layer_of(name: str) -> int:
    parts = name.split(".")[1:]
    if not parts:
        return FACADE
    assert parts[0] in LAYERS, f"{name} is not placed in a layer: add it to docs/architecture.md and here"
    return LAYERS[parts[0]]


def layer_violations(root: Path) -> list[str]:
    known = modules(root)
    found = []
    for name, path in known.items():
        for target in imports(name, path, known):
            if layer_of(target) > layer_of(name):
                found.append(f"{name} (layer {layer_of(name)}) imports {target} (layer {layer_of(target)})")
    return found


def cycles(root: Path) -> list[list[str]]:
    """Groups of modules that import each other, directly or around a loop (Tarjan's strongly
    connected components of the import graph)."""
    known = modules(root)
    graph = {name: sorted(imports(name, path, known) - {name}) for name, path in known.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for name in graph:
        if name not in index:
            visit(name)
    return found


def test_every_module_imports_only_lower_or_same_layers():
    violations = layer_violations(PACKAGE)
    assert not violations, "\n".join(violations)


def test_no_modules_import_each_other_in_a_cycle():
    found = cycles(PACKAGE)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(group) for group in found)


def test_nothing_imports_the_cli():
    known = modules(PACKAGE)
    offenders = [
        name
        for name, path in known.items()
        if not name.startswith(("trainscale.cli", "trainscale.__main__"))
        and any(t.startswith("trainscale.cli") for t in imports(name, path, known))
    ]
    assert not offenders


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "trainscale"
    for rel, text in {"__init__.py": "", **files}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_the_checks_catch_a_subpackage_imported_from_the_facade_and_a_relative_import(tmp_path):
    root = _package(
        tmp_path,
        {
            "strategies/__init__.py": "",
            "runtime/__init__.py": "",
            "runtime/a.py": "def f():\n    from trainscale import strategies\n",
            "runtime/b.py": "from ..strategies import x\n",
            "runtime/c.py": "import trainscale\n",
            "errors.py": "",
            "strategies/ok.py": "from trainscale import runtime\nfrom trainscale import errors\n",
        },
    )
    assert sorted(layer_violations(root)) == [
        "trainscale.runtime.a (layer 3) imports trainscale.strategies (layer 4)",
        "trainscale.runtime.b (layer 3) imports trainscale.strategies (layer 4)",
        "trainscale.runtime.c (layer 3) imports trainscale (layer 5)",
    ]


def test_the_checks_catch_a_cycle_through_lazy_imports(tmp_path):
    root = _package(
        tmp_path,
        {
            "checkpoint/__init__.py": "",
            "checkpoint/manager.py": "def f():\n    from trainscale.checkpoint import sharded\n",
            "checkpoint/sharded.py": "def g():\n    from trainscale.checkpoint.manager import f\n",
            "checkpoint/layout.py": "",
        },
    )
    assert cycles(root) == [["trainscale.checkpoint.manager", "trainscale.checkpoint.sharded"]]
