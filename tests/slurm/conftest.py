"""Everything under tests/slurm is marked ``slurm``; the cluster fixture is tests/helpers/slurm_cluster.py.

``sandbox``: a stock image (Python and torch, no trainscale: tests/helpers/container_image.py) and a user
profile ``local-test-containers`` whose singularity is tests/containers/singularity, a real bubblewrap
sandbox (test_containers.py, test_journeys.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from helpers.container_image import build_image
from helpers.slurm_cluster import TERMINAL_STATES, SlurmCluster  # noqa: F401 (the tests import them from here)

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SHIM = ROOT / "tests" / "containers"
INSTALL = ROOT / ".ci" / "install-sandbox.sh"
PROFILE = """extends = "local-test"
description = "the local test cluster, with the test sandbox as singularity"

[container]
runtime = "singularity"
"""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.slurm)


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    if shutil.which("bwrap") is None:
        done = subprocess.run(["bash", str(INSTALL)], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            reason = f"bubblewrap unavailable: {done.stderr.strip()}"
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(reason)
            pytest.skip(reason)
    root = tmp_path_factory.mktemp("containers")
    t0 = time.monotonic()
    image = build_image(root / "pytorch-stock")
    print(f"\n[containers] image built in {time.monotonic() - t0:.1f}s: {image}")
    (root / "config" / "profiles").mkdir(parents=True)
    (root / "config" / "profiles" / "local-test-containers.toml").write_text(PROFILE)
    return {"image": image, "config": root / "config", "shim": SHIM}
