"""What a script imports and where from, read from its source (never run).

Two facts feed the snapshot (snapshot.py) and its lint:
- the directories the script adds to ``sys.path`` relative to its own file: the forms course scripts
  use, ``sys.path.append(os.path.join(os.path.dirname(__file__), ".."))``, ``sys.path.insert(0, str(Path(
  __file__).resolve().parents[1]))``, through module-level names (``HERE = os.path.dirname(...)``);
  an expression that cannot be worked out without running the script is left out;
- the top-level modules it imports, with the line and whether the import is optional (inside ``try``).
"""

from __future__ import annotations

import ast
import importlib.machinery
import os
import sys
from dataclasses import dataclass
from pathlib import Path

_PATH_FUNCS = {
    "dirname": os.path.dirname,
    "abspath": os.path.abspath,
    "realpath": os.path.abspath,
    "normpath": os.path.normpath,
}


@dataclass(frozen=True)
class Value:
    text: str
    from_file: bool
    """Derived from ``__file__``: moves with the script into the snapshot."""


def _name(node: ast.AST) -> str:
    return node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""


def _eval(node: ast.AST, env: dict[str, Value], file: str) -> Value | None:
    """A path expression's value, or None when it needs running the script."""
    if isinstance(node, ast.Name):
        return Value(file, True) if node.id == "__file__" else env.get(node.id)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return Value(node.value, False)
    if isinstance(node, ast.JoinedStr):
        parts = [_eval(v.value if isinstance(v, ast.FormattedValue) else v, env, file) for v in node.values]
        if any(p is None for p in parts):
            return None
        return Value("".join(p.text for p in parts), any(p.from_file for p in parts))  # type: ignore[union-attr]
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Div)):
        left, right = _eval(node.left, env, file), _eval(node.right, env, file)
        if left is None or right is None:
            return None
        text = left.text + right.text if isinstance(node.op, ast.Add) else os.path.join(left.text, right.text)
        return Value(text, left.from_file or right.from_file)
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        inner = _eval(node.value, env, file)
        return Value(os.path.dirname(os.path.abspath(inner.text)), inner.from_file) if inner else None
    if isinstance(node, ast.Subscript) and _name(node.value) == "parents":
        inner = _eval(node.value.value, env, file) if isinstance(node.value, ast.Attribute) else None  # type: ignore[attr-defined]
        index = node.slice
        if inner is None or not (isinstance(index, ast.Constant) and isinstance(index.value, int)):
            return None
        text = os.path.abspath(inner.text)
        for _ in range(index.value + 1):
            text = os.path.dirname(text)
        return Value(text, inner.from_file)
    if not isinstance(node, ast.Call):
        return None
    func = _name(node.func)
    args = [_eval(a, env, file) for a in node.args]
    if any(a is None for a in args):
        return None
    values: list[Value] = args  # type: ignore[assignment]
    if isinstance(node.func, ast.Attribute) and func in ("resolve", "absolute", "joinpath", "expanduser"):
        base = _eval(node.func.value, env, file)
        if base is None:
            return None
        if func == "joinpath":
            return Value(os.path.join(base.text, *(v.text for v in values)), base.from_file)
        return Value(os.path.abspath(os.path.expanduser(base.text)), base.from_file)
    if not values:
        return None
    from_file = any(v.from_file for v in values)
    if func == "join":
        return Value(os.path.join(*(v.text for v in values)), from_file)
    if func in _PATH_FUNCS and len(values) == 1:
        return Value(_PATH_FUNCS[func](values[0].text), from_file)
    if func in ("Path", "PurePath", "PosixPath", "str", "fspath") and len(values) == 1:
        return values[0]
    return None


def _path_call(node: ast.Call) -> tuple[str, ast.AST] | None:
    """``sys.path.append(X)`` / ``insert(I, X)`` / ``site.addsitedir(X)`` -> (``append`` or ``insert``, X)."""
    func = node.func
    if not isinstance(func, ast.Attribute):
        return None
    owner = func.value
    if func.attr == "addsitedir" and _name(owner) == "site" and node.args:
        return "append", node.args[0]
    if not (isinstance(owner, ast.Attribute) and owner.attr == "path" and _name(owner.value) == "sys"):
        return None
    if func.attr == "append" and node.args:
        return "append", node.args[0]
    if func.attr == "insert" and len(node.args) == 2:
        first = isinstance(node.args[0], ast.Constant) and node.args[0].value == 0
        return ("insert" if first else "append"), node.args[1]
    return None


def path_additions(tree: ast.AST, file: str) -> tuple[tuple[str, bool], ...]:
    """The ``__file__``-relative directories the script puts on sys.path: (directory, put first)."""
    env: dict[str, Value] = {}
    found: list[tuple[str, bool]] = []
    nodes = sorted(
        (n for n in ast.walk(tree) if isinstance(n, (ast.Assign, ast.Call))), key=lambda n: (n.lineno, n.col_offset)
    )
    for node in nodes:
        if isinstance(node, ast.Assign):
            if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                value = _eval(node.value, env, file)
                if value is not None:
                    env[node.targets[0].id] = value
                else:
                    env.pop(node.targets[0].id, None)
            continue
        call = _path_call(node)
        if call is None:
            continue
        value = _eval(call[1], env, file)
        if value is not None and value.from_file:
            found.append((os.path.normpath(os.path.abspath(value.text)), call[0] == "insert"))
    return tuple(dict.fromkeys(found))


def _optional_lines(tree: ast.AST) -> set[int]:
    """Lines of imports inside a ``try`` (the script copes when they fail)."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try):
            for inner in node.body:
                lines |= {n.lineno for n in ast.walk(inner) if isinstance(n, (ast.Import, ast.ImportFrom))}
    return lines


def imported(tree: ast.AST) -> tuple[tuple[str, int, bool], ...]:
    """(top-level module, line, optional) for every absolute import, first occurrence each."""
    optional = _optional_lines(tree)
    seen: dict[str, tuple[str, int, bool]] = {}
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name.split(".")[0] for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module.split(".")[0]]
        for name in names:
            entry = (name, node.lineno, node.lineno in optional)
            if name not in seen or entry[1] < seen[name][1]:
                seen[name] = entry
    return tuple(sorted(seen.values(), key=lambda e: e[1]))


@dataclass(frozen=True)
class Unseen:
    module: str
    line: int
    optional: bool
    location: str
    """Where it resolves now (outside the snapshot)."""


def _finds(name: str, directory: str) -> str | None:
    try:
        spec = importlib.machinery.PathFinder.find_spec(name, [directory])
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.origin and spec.origin not in ("namespace", "built-in"):
        return spec.origin
    locations = list(spec.submodule_search_locations or [])
    return locations[0] if locations else directory


def unseen_imports(
    script: Path, root: Path, additions: tuple[tuple[str, bool], ...], modules: tuple[tuple[str, int, bool], ...]
) -> list[Unseen]:
    """Imports the job cannot resolve the way ``trainscale run`` does: found (now) through a directory the script
    adds relative to its own file that lies outside the snapshot root. In the job that directory is its
    counterpart beside the snapshot, which does not exist."""
    outside = [(d, first) for d, first in additions if not (Path(d) == root or root in Path(d).parents)]
    if not outside:
        return []
    own = str(script.absolute().parent)
    cwd = os.getcwd()
    site = [p for p in sys.path[1:] if p and os.path.abspath(p) != cwd]
    out = []
    for name, line, optional in modules:
        if name in sys.builtin_module_names or name in getattr(sys, "stdlib_module_names", ()):
            continue
        order = [d for d, first in additions if first] + [own, cwd, *site] + [d for d, first in additions if not first]
        for directory in order:
            where = _finds(name, directory)
            if where is None:
                continue
            if any(directory == d for d, _ in outside):
                out.append(Unseen(module=name, line=line, optional=optional, location=where))
            break
    return out
