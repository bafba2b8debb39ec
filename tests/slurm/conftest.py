"""Everything under tests/slurm is marked ``slurm``; the cluster fixture is tests/helpers/slurm_cluster.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.slurm_cluster import TERMINAL_STATES, SlurmCluster  # noqa: F401 (the tests import them from here)

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.slurm)


