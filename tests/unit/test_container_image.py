"""The tests' stock image (tests/helpers/container_image.py) ships each module compiled, as a real image does."""

from __future__ import annotations

import importlib.util
import sysconfig
from pathlib import Path

import pytest_timeout
from helpers.container_image import copy_distributions


def test_each_module_is_copied_with_its_bytecode(tmp_path):
    """A venv compiled after pip installed it lists no bytecode in its distributions' records; without it a
    read-only image's every process compiles torch again (seconds of CPU a rank)."""
    source = Path(pytest_timeout.__file__)
    cached = Path(importlib.util.cache_from_source(str(source)))
    assert cached.is_file()  # .venv is compiled (scripts/setup-env.sh)
    site = (
        tmp_path / "opt" / "python" / "lib" / "python3" / "site-packages"
    )  # as deep as the image's: scripts go to ../../../bin
    copy_distributions(("pytest-timeout",), site)
    ours = Path(sysconfig.get_paths()["purelib"])
    assert (site / source.relative_to(ours)).is_file()
    assert (site / cached.relative_to(ours)).read_bytes() == cached.read_bytes()
