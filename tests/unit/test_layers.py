"""The dependency rule of docs/architecture.md: each layer imports only itself and the layers below it."""

from __future__ import annotations

import ast
from pathlib import Path

import trainscale

PACKAGE = Path(trainscale.__file__).parent
LAYERS = {
    "errors": 0, "_version": 0, "__init__": 0, "__main__": 7,
    "env": 1,
    "topology": 2,
    "runtime": 3,
    "strategies": 4, "data": 4, "checkpoint": 4,
    "launch": 5, "profiles": 5, "config": 5,
    "bench": 6, "doctor": 6, "workloads": 6,
    "cli": 7,
}


def _layer_of(parts: list[str]) -> int:
    top = parts[0] if parts else "__init__"
    assert top in LAYERS, f"trainscale.{top} is not placed in a layer: add it to docs/architecture.md and here"
    return LAYERS[top]


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = set()
    for node in ast.walk(tree):  # lazy imports inside functions count too
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return {n for n in names if n == "trainscale" or n.startswith("trainscale.")}


def test_every_module_imports_only_lower_or_same_layers():
    violations = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE).with_suffix("")
        own = _layer_of(list(rel.parts))
        for name in _imports(path):
            parts = name.split(".")[1:]
            if not parts:  # `import trainscale` / `from trainscale import x`: the public facade
                continue
            if _layer_of(parts) > own:
                violations.append(f"{'/'.join(rel.parts)} (layer {own}) imports {name} (layer {_layer_of(parts)})")
    assert not violations, "\n".join(violations)


def test_nothing_imports_the_cli():
    offenders = [str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
                 if p.relative_to(PACKAGE).parts[0] not in ("cli", "__main__.py")
                 and any(n.startswith("trainscale.cli") for n in _imports(p))]
    assert not offenders
