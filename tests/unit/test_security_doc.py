"""docs/security.md stays true: every test it names exists, trainscale's own code never deserialises
anything that can carry code, and DeepSpeed's checkpoint loading is still the unrestricted one the
document warns about (a DeepSpeed that stops doing so makes this test fail: update the document)."""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "security.md"
SOURCE = ROOT / "src" / "trainscale"


def test_every_test_the_document_names_exists():
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)(?:\[[^\]]*\])?`", DOC.read_text())
    assert len(named) >= 20
    missing = []
    for path, name in named:
        file = ROOT / path
        functions = (
            {n.name for n in ast.walk(ast.parse(file.read_text())) if isinstance(n, ast.FunctionDef)}
            if file.exists()
            else set()
        )
        if name not in functions:
            missing.append(f"{path}::{name}")
    assert not missing, missing


def _calls(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            yield node, ast.unparse(node.func)


def test_trainscale_never_deserialises_code():
    forbidden = {
        "eval",
        "exec",
        "pickle.load",
        "pickle.loads",
        "marshal.load",
        "marshal.loads",
        "yaml.load",
        "yaml.unsafe_load",
        "shelve.open",
        "dill.load",
        "dill.loads",
    }
    # trainscale.launch(fn) / trainscale.slurm.submit(fn): the user's own call and results (docs/security.md)
    own_code = {"src/trainscale/launch/runner.py", "src/trainscale/launch/slurm/future.py"}
    found, unpicklers, own = [], [], set()
    for path in sorted(SOURCE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        where = path.relative_to(ROOT)
        for call, name in _calls(tree):
            if name in forbidden and name == "pickle.loads" and str(where) in own_code:
                own.add(str(where))
            elif name in forbidden:
                found.append(f"{where}:{call.lineno}: {name}")
            if name == "torch.load" and not any(
                k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in call.keywords
            ):
                found.append(f"{where}:{call.lineno}: torch.load without weights_only=True")
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            if any("Unpickler" in ast.unparse(base) for base in cls.bases):
                methods = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
                unpicklers.append((str(where), cls.name, "find_class" in methods))
    assert not found, found
    assert own == own_code
    assert unpicklers == [
        ("src/trainscale/checkpoint/dcp_io.py", "_MetadataUnpickler", True),
        ("src/trainscale/runtime/hangwatch/ledger.py", "_PlainData", True),
    ]


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
def test_deepspeed_still_unpickles_its_own_files_unrestricted():
    # Read, not imported: importing deepspeed sets environment variables.
    package = Path(importlib.util.find_spec("deepspeed").submodule_search_locations[0])
    tree = ast.parse((package / "runtime" / "checkpoint_engine" / "torch_checkpoint_engine.py").read_text())
    engine = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "TorchCheckpointEngine")
    load = next(n for n in engine.body if isinstance(n, ast.FunctionDef) and n.name == "load")
    loads = [call for call, name in _calls(load) if name == "torch.load"]
    assert loads and all(
        any(k.arg == "weights_only" and getattr(k.value, "value", None) is False for k in call.keywords)
        for call in loads
    )
