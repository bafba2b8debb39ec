"""docs/errors.md stays true: every row names a test that exists and quotes a message that the source
still raises. A reworded message or a renamed test breaks this test, not the reader."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "errors.md"
ROW = re.compile(r"^\|(?P<did>[^|]+)\|\s*\"(?P<msg>[^\"]+)\"\s*\|(?P<fix>[^|]+)\|\s*`(?P<test>[^`]+)`\s*\|$")


def rows() -> list[re.Match]:
    table_rows = [
        line
        for line in DOC.read_text().splitlines()
        if line.startswith("|") and not line.startswith(("|---", "| what you did"))
    ]
    parsed = [ROW.match(line) for line in table_rows]
    bad = [line for line, m in zip(table_rows, parsed) if m is None]
    assert not bad, f"rows without a quoted message and a test reference: {bad}"
    return parsed


def _source_text() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "src" / "trainscale").rglob("*.py"))


def test_the_catalogue_is_substantial():
    assert len(rows()) >= 50


def test_every_row_names_an_existing_test():
    missing = []
    for m in rows():
        path, _, name = m["test"].partition("::")
        file = ROOT / path
        if not file.exists():
            missing.append(m["test"])
            continue
        names = {n.name for n in ast.walk(ast.parse(file.read_text())) if isinstance(n, ast.FunctionDef)}
        if name not in names:
            missing.append(m["test"])
    assert not missing, missing


def test_every_quoted_message_is_still_in_the_source():
    source = _source_text()
    stale = [m["msg"] for m in rows() if m["msg"] not in source]
    assert not stale, stale
