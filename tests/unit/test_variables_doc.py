"""docs/variables.md lists every TRAINSCALE_* variable the source names, and only those."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAME = re.compile(r"\bTRAINSCALE_[A-Z0-9_]*[A-Z0-9]_?")


def _names(text: str) -> set[str]:
    return set(NAME.findall(text))


def test_every_variable_in_the_source_is_listed_and_every_listed_one_exists():
    source = _names("\n".join(p.read_text() for p in (ROOT / "src" / "trainscale").rglob("*.py")))
    doc = _names((ROOT / "docs" / "variables.md").read_text())
    prefixes = {n for n in doc if n.endswith("_")}  # TRAINSCALE_TRAIN_<FIELD>: a family, named by its prefix

    def in_a_family(name: str) -> bool:
        return any(name.startswith(p) and name != p for p in prefixes)

    assert {n for n in source - doc if not in_a_family(n)} == set(), "add these to docs/variables.md"
    assert {n for n in doc - source if not in_a_family(n)} == set(), "docs/variables.md lists what the source lacks"
