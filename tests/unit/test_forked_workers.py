"""Which workers `trainscale run` forks from its forkserver (launch/local.py, docs/launch.md "Workers of
trainscale's own"): trainscale's own modules, and only where trainscale's command line owns the process."""

from __future__ import annotations

import pytest

from trainscale.launch import bootstrap
from trainscale.launch.local import LocalLaunchSpec, own_worker


@pytest.fixture
def command_line(monkeypatch):
    monkeypatch.setattr(bootstrap, "FORK_OWN_WORKERS", True)


def test_trainscales_own_module_is_forked_from_the_command_line(command_line):
    assert own_worker(LocalLaunchSpec(target="trainscale.workloads", module=True, args=("cnn",)))


def test_a_users_script_or_module_gets_a_fresh_interpreter(command_line, tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    assert not own_worker(LocalLaunchSpec(target=str(script)))
    assert not own_worker(LocalLaunchSpec(target="json.tool", module=True))


def test_torchruns_python_exec_keeps_fresh_interpreters(command_line, monkeypatch):
    monkeypatch.setenv("PYTHON_EXEC", "/usr/bin/python3")
    assert not own_worker(LocalLaunchSpec(target="trainscale.workloads", module=True, args=("cnn",)))


def test_a_library_callers_process_keeps_its_forkserver(monkeypatch):
    monkeypatch.setattr(bootstrap, "FORK_OWN_WORKERS", False)
    assert not own_worker(LocalLaunchSpec(target="trainscale.workloads", module=True, args=("cnn",)))
