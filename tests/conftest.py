"""Test hygiene for every test: environment restored, no process group or stray files left behind."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

# The suite runs three workers and their ranks on two cores. An OpenMP thread of torch's that waits for work
# spinning (libgomp's default) takes the cycles another process needs: 4 ranks x 2 threads of the CNN workload
# on 2 cores took 24 CPU-s and 14.6 s spinning, 16.5 CPU-s and 9.7 s asleep. Set before torch loads here, and
# inherited by every launcher, rank and job; what a run computes is the same either way.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

sys.path.insert(0, str(Path(__file__).parent))

pytest_plugins = ("helpers.slurm_cluster",)  # the 2-node SLURM test cluster, for tests/slurm and tests/conformance

from helpers.readme import LONGEST_FIRST, module  # noqa: E402  (README's journey: its parts' modules)
from helpers.slurm_cluster import SESSION_ENV  # noqa: E402  (variables the session's cluster sets)

# Variables a test may legitimately leave changed (set by libraries at import time).
_IGNORED = {
    "KMP_DUPLICATE_LIB_OK",
    "KMP_INIT_AT_FORK",
    "PYTEST_CURRENT_TEST",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
    "TORCHINDUCTOR_CACHE_DIR",
}  # torch.utils.flop_counter's import of inductor sets it


def _restored(what: str):
    before = dict(os.environ)
    yield
    after = dict(os.environ)
    leaked = {k for k in set(before) ^ set(after) | {k for k in before if k in after and before[k] != after[k]}}
    owned = SESSION_ENV & leaked  # set by a session fixture first used inside this module: it stays
    leaked -= _IGNORED | owned
    os.environ.clear()
    os.environ.update(before)
    os.environ.update({k: after[k] for k in owned if k in after})
    assert not leaked, f"{what} leaked environment variables: {sorted(leaked)}"


@pytest.fixture(autouse=True)
def _restore_environ():
    yield from _restored("test")


@pytest.fixture(autouse=True, scope="module")
def _restore_environ_per_module():
    """Module fixtures run outside a test's own check: one that called trainscale.init() in this process
    once left OMP_NUM_THREADS=2 for every later test, whose 2-rank runs then ran 4 threads on 2 cores."""
    yield from _restored("a module fixture")


@pytest.fixture(autouse=True, scope="session")
def _forks_as_the_command_line(pytestconfig):
    """Tests run trainscale's command line in this process (``main([...])``), as ``trainscale ...`` runs in a
    process of its own: trainscale's own workers (workloads, launch(fn)'s runner, the all-reduce) are then
    forked from this process's forkserver, started here once, outside any test's captured output (its
    workers write to their log files; launch/local.py)."""
    from helpers.multiproc import start_forkserver

    from trainscale.launch import bootstrap

    bootstrap.FORK_OWN_WORKERS = True
    capture = pytestconfig.pluginmanager.getplugin("capturemanager")  # None under -p no:capture
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        start_forkserver()


@pytest.fixture(autouse=True)
def _no_process_group():
    yield
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        pytest.fail("test left a torch.distributed process group behind")


@pytest.fixture(autouse=True)
def _no_stray_files():
    cwd = Path.cwd()
    before = set(cwd.iterdir())
    yield
    new = set(cwd.iterdir()) - before
    assert not new, f"test left files in {cwd}: {sorted(p.name for p in new)}"


@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    """Run the test with the working directory in a fresh temporary folder."""
    monkeypatch.chdir(tmp_path)
    return tmp_path


def pytest_collection_modifyitems(config, items):
    """Files in order of their expected length, longest first: the parts of README's journey (three to five
    minutes each alone, docs/development.md), then files with SLURM or slow tests, then the rest. make test
    spreads whole files over processes in this order (--dist loadfile --no-loadscope-reorder; by default xdist
    puts files with the most tests first), so the longest start at once instead of ending the run alone."""
    readme = {module(part): rank for rank, part in enumerate(LONGEST_FIRST)}

    def weight(item) -> int:
        if item.path.name in readme:
            return readme[item.path.name]
        slow = item.get_closest_marker("slurm") or item.get_closest_marker("slow")
        return len(readme) + (0 if slow else 1)

    first: dict[Path, tuple[int, int]] = {}
    for index, item in enumerate(items):
        w, i = first.get(item.path, (len(readme) + 2, index))
        first[item.path] = (min(w, weight(item)), i)
    items[:] = sorted(items, key=lambda item: first[item.path])


def pytest_xdist_make_scheduler(config, log):
    """make test's --dist loadfile, with tests/slurm and the conformance tests that submit jobs as one unit:
    they run one after another on one process. The test cluster has two nodes, so their jobs queue behind
    each other anyway; run side by side they only wait longer, past the tests' watch limits (seen with three
    processes). README's journey's parts, which submit a few, are the only other submitters. The conformance tests
    that launch on this machine are a unit of their own: in the chain they made it the run's last minutes,
    with one process left working."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class SlurmTogether(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = super()._split_scope(nodeid)
            return "tests/slurm" if path.startswith("tests/slurm/") or "::test_style_under_slurm" in nodeid else path

    return SlurmTogether(config, log)
