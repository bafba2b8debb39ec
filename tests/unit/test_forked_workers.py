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


def test_another_start_method_gives_fresh_interpreters(command_line):
    for method in ("spawn", "fork"):
        spec = LocalLaunchSpec(
            target="trainscale.workloads", module=True, args=("cnn",), torchrun={"start_method": method}
        )
        assert not own_worker(spec), method


def test_torchruns_local_rank_macro_reaches_a_forked_workers_arguments(command_line, in_tmp, monkeypatch):
    """torch's agent replaces ${local_rank} in the top-level string arguments of a function entrypoint as in a
    binary's: the bootstrap's arguments are each one of them, the launcher's state is not a string."""
    from torch.distributed.elastic.utils import macros

    import trainscale.launch.local as local

    monkeypatch.setattr(local, "start_forkserver", lambda: None)  # the arguments only: no server needed
    in_dollars = in_tmp / "a$$b"
    in_dollars.mkdir()
    monkeypatch.chdir(in_dollars)
    fn, args = local.entrypoint(
        LocalLaunchSpec(
            target="trainscale.workloads", module=True, args=("cnn", "--metrics-out", "m-${local_rank}.json")
        )
    )
    assert fn is bootstrap.forked
    state, *argv = macros.substitute(args, "1")
    assert argv == ["--module", "trainscale.workloads", "cnn", "--metrics-out", "m-1.json"]
    assert state["cwd"] == str(in_dollars)  # a directory is not an argument: left as it is


def test_every_failed_forked_rank_is_named_but_not_one_that_had_returned():
    """torch's context for function workers names only the first rank it saw fail; the agent adds the others
    that ended badly, but not one that had returned and was stopped while it waited for the rest."""
    from types import SimpleNamespace as NS

    from trainscale.launch.agent import _every_failure

    processes = [NS(exitcode=-15, pid=10), NS(exitcode=1, pid=11), NS(exitcode=-15, pid=12), NS(exitcode=None, pid=13)]
    context = NS(_pc=NS(processes=processes), _return_values={0: None}, error_files={i: f"e{i}" for i in range(4)})
    group = NS(workers=[NS(global_rank=4 + i) for i in range(4)])
    failures = {5: "torch's own"}
    _every_failure(context, group, failures)
    assert sorted(failures) == [5, 6] and failures[5] == "torch's own"
    assert (failures[6].local_rank, failures[6].pid, failures[6].exitcode) == (2, 12, -15)


def _wait_on(event) -> None:
    event.wait()


def test_a_rank_killed_while_it_waited_for_the_others_does_not_hold_the_launcher(tmp_path):
    """torch's agent lets returned function workers go with a multiprocessing Event, whose set() waits for every
    waiting process to answer. Two real processes wait on one; one is SIGKILLed while it waits (the chaos
    benchmark's trial 7): set() still returns, and the live one is let go."""
    import multiprocessing as mp
    import os
    import signal
    import threading
    import time
    from types import SimpleNamespace

    from trainscale.launch.agent import release_without_waiting

    ctx = mp.get_context("spawn")
    event = ctx.Event()
    killed, live = ctx.Process(target=_wait_on, args=(event,)), ctx.Process(target=_wait_on, args=(event,))
    killed.start()
    live.start()
    deadline = time.monotonic() + 60
    while event._cond._sleeping_count.get_value() < 2:  # both inside Condition.wait, as a returned rank is
        assert time.monotonic() < deadline, "the processes never waited"
        time.sleep(0.01)
    os.kill(killed.pid, signal.SIGKILL)
    killed.join()
    release_without_waiting(SimpleNamespace(_worker_finished_event=event))
    setter = threading.Thread(target=event.set, daemon=True)  # multiprocessing's own set() would never return
    setter.start()
    setter.join(timeout=30)
    assert not setter.is_alive() and event.is_set()
    live.join(timeout=30)
    assert live.exitcode == 0 and killed.exitcode == -signal.SIGKILL
