"""What the user's script does that the job plan must respect, read from its source (never run).

Facts that matter before submission (and imports.py's: what it adds to sys.path, what it imports):
- does it import trainscale? Then a container image must have trainscale importable (lint).
- does it pick its GPU by a rank index (``torch.cuda.set_device(local_rank)``, ``f"cuda:{rank}"``,
  ``device_ids=[local_rank]``, ``x.to(engine.local_rank)``)? Then each srun task must see every GPU of
  its node: with only its own GPU visible that index would be out of range.
- does it checkpoint through trainscale (``rt.checkpoint``/``rt.resume``, a ``Checkpointer``, the training
  ``Loop``, a built-in workload)? Only then does ``--requeue`` or ``--chain`` continue it where it stopped.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

from trainscale.launch.slurm.imports import imported, path_additions


@dataclass(frozen=True)
class ScriptFacts:
    path: str | None = None
    """The source read (None: nothing could be read, e.g. a built-in workload or a missing file)."""
    imports_trainscale: bool = False
    gpu_index_line: int | None = None
    """Line of the first place that selects a GPU by a rank-like index, or None."""
    gpu_index_code: str = ""
    """That line's code, for the message."""
    path_additions: tuple[tuple[str, bool], ...] = ()
    """Directories the script adds to sys.path relative to its own file: (directory, put first) (imports.py)."""
    imports: tuple[tuple[str, int, bool], ...] = ()
    """Top-level modules it imports: (name, line, inside try)."""
    checkpoints: bool = False
    """It saves and resumes through trainscale: ``rt.checkpoint``/``rt.resume``, a Checkpointer, the Loop, a
    built-in workload (so a requeued job or a chain's next link continues it)."""


def _is_zero(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value in (0, "cuda:0", "cuda")


def _rank_like(node: ast.AST) -> bool:
    """A name or attribute that reads like a rank: local_rank, rank, args.local_rank, engine.local_rank."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "rank" in name.lower() or name.lower() in ("device_id", "gpu", "gpu_id")


def _selects_by_index(node: ast.AST) -> bool:
    if isinstance(node, ast.JoinedStr):  # f"cuda:{local_rank}"
        parts = node.values
        return any(
            isinstance(a, ast.Constant) and str(a.value).endswith("cuda:") and isinstance(b, ast.FormattedValue)
            for a, b in zip(parts, parts[1:])
        )
    if not isinstance(node, ast.Call):
        return False
    func = (
        node.func.attr
        if isinstance(node.func, ast.Attribute)
        else node.func.id
        if isinstance(node.func, ast.Name)
        else ""
    )
    args = list(node.args)
    if func == "set_device" and args and not _is_zero(args[0]):
        return True
    if (
        func == "device"
        and len(args) >= 2
        and isinstance(args[0], ast.Constant)
        and args[0].value == "cuda"
        and not _is_zero(args[1])
    ):
        return True
    if func in ("to", "cuda") and args and _rank_like(args[0]):
        return True
    for kw in node.keywords:
        if kw.arg in ("device_ids", "output_device") and kw.value is not None:
            values = kw.value.elts if isinstance(kw.value, (ast.List, ast.Tuple)) else [kw.value]
            if any(not _is_zero(v) for v in values):
                return True
    return False


_CHECKPOINTING_NAMES = ("Checkpointer", "Loop")
_CHECKPOINTING_MODULES = ("trainscale.checkpoint", "trainscale.workloads")


def _checkpoints(node: ast.AST) -> bool:
    """One node that shows the script saves and resumes through trainscale."""
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("trainscale"):
        return (node.module or "").startswith(_CHECKPOINTING_MODULES) or any(
            a.name in _CHECKPOINTING_NAMES for a in node.names
        )
    if isinstance(node, ast.Import):
        return any(a.name.startswith(_CHECKPOINTING_MODULES) for a in node.names)
    if isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in ("checkpoint", "resume"):
            # rt.checkpoint(...)/rt.resume(...): a runtime's, not torch.utils.checkpoint.checkpoint(fn, x)
            return isinstance(func.value, ast.Name) and func.value.id != "checkpoint"
        name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
        return name in _CHECKPOINTING_NAMES
    return False


def facts_from_source(source: str, path: str = "<script>") -> ScriptFacts:
    try:
        tree = ast.parse(source, path)
    except SyntaxError:
        return ScriptFacts(path=path)
    imports = checkpoints = False
    first: ast.AST | None = None
    for node in ast.walk(tree):
        checkpoints = checkpoints or _checkpoints(node)
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "trainscale" for a in node.names):
            imports = True
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "trainscale":
            imports = True
        elif _selects_by_index(node) and (first is None or node.lineno < first.lineno):
            first = node
    line = first.lineno if first is not None else None
    code = source.splitlines()[line - 1].strip() if line else ""
    return ScriptFacts(
        path=path,
        imports_trainscale=imports,
        gpu_index_line=line,
        gpu_index_code=code,
        path_additions=path_additions(tree, str(Path(path).absolute())),
        imports=imported(tree),
        checkpoints=imports and checkpoints,
    )


def script_facts(script: str | None = None, module: str | None = None, workload: str | None = None) -> ScriptFacts:
    """Facts about the job's target; a built-in workload is trainscale itself (it selects its own GPU)."""
    if workload:
        return ScriptFacts(imports_trainscale=True, checkpoints=True)
    path = None
    if script:
        path = Path(script)
    elif module:
        try:
            found = importlib.util.find_spec(module)
        except (ImportError, ValueError):
            found = None
        path = Path(found.origin) if found is not None and found.origin and found.origin.endswith(".py") else None
    if path is None or not path.is_file():
        return ScriptFacts()
    try:
        return facts_from_source(path.read_text(errors="replace"), str(path))
    except OSError:
        return ScriptFacts()
