"""Scale tests: trainscale's own machinery at 16 SLURM nodes and 64 local ranks, on this one machine.

Marked ``scale`` and left out of every run that does not ask for them with ``-m scale`` (``make
test-scale``): they take minutes and most of the machine's memory (docs/scaling.md, "Scale by simulation").
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = [item for item in items if HERE in Path(str(item.path)).resolve().parents]
    for item in ours:
        item.add_marker(pytest.mark.scale)
    if "scale" not in (config.option.markexpr or ""):
        config.hook.pytest_deselected(items=ours)
        items[:] = [item for item in items if item not in ours]
