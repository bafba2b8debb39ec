"""How a worker ends (launch/bootstrap.py): the exit status the script chose, never an abort at teardown;
a crash keeps its signal; a worker whose agent is gone does not run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

SCRIPT = r"""
import os, sys
import torch, torch.distributed as dist
from trainscale.launch.bootstrap import release_process_groups

def gloo_threads():
    names = (open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
    return sum(name.startswith(("pt_gloo", "gloo")) for name in names)

dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
tensor = torch.ones(3)
dist.all_reduce(tensor)
print("before", gloo_threads())
release_process_groups()  # the script never destroyed its group
print("after", gloo_threads(), dist.is_initialized())
"""


def test_a_group_the_script_left_is_destroyed_and_its_threads_joined(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "store")], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert int(lines["before"]) >= 2  # gloo's run loops and its transport loop
    assert lines["after"] == "0 False"


# What torch 2.13 + gloo do at interpreter teardown in about a third of runs (a destructor that aborts),
# made certain: an object whose destructor raises SIGABRT lives until the interpreter clears sys.modules.
ENDS = r"""
import atexit, os, pathlib, signal, sys, threading, time

class AbortsAtTeardown:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGABRT)

out, how = pathlib.Path(sys.argv[1]), sys.argv[2]
if how in ("return", "0", "None", "3"):
    sys.modules["aborts_at_teardown"] = AbortsAtTeardown()
atexit.register(lambda: (out / "atexit").write_text("ran"))

def writer():  # a background writer still busy when the script returns (a checkpoint, a log)
    time.sleep(0.3)
    (out / "thread").write_text("joined")

threading.Thread(target=writer).start()
print("no newline, still flushed", end="")
if how == "raise":
    raise ValueError("the script failed")
if how == "abort":
    os.abort()
if how == "segfault":
    import ctypes
    ctypes.string_at(0)
if how != "return":
    sys.exit(None if how == "None" else int(how))
"""


def _bootstrap(tmp_path, how: str, **env: str) -> subprocess.CompletedProcess:
    script = tmp_path / "ends.py"
    script.write_text(ENDS)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "TRAINSCALE_"))}
    return subprocess.run(
        [sys.executable, "-m", "trainscale.launch.bootstrap", "--script", str(script), str(tmp_path), how],
        capture_output=True,
        text=True,
        timeout=120,
        env={**environ, **env},
    )


@pytest.mark.parametrize("how, status", [("return", 0), ("0", 0), ("None", 0), ("3", 3)])
def test_a_script_that_ends_by_itself_exits_with_its_own_status_and_no_teardown(tmp_path, how, status):
    """Returned or sys.exit(N): N (0 after a return), never the abort of a destructor at teardown; what a
    normal exit runs still runs (non-daemon threads joined, then atexit handlers, stdout flushed)."""
    proc = _bootstrap(tmp_path, how)
    assert proc.returncode == status, proc.stderr
    assert proc.stdout == "no newline, still flushed"
    assert (tmp_path / "thread").read_text() == "joined" and (tmp_path / "atexit").read_text() == "ran"


C_ATEXIT = r"""
import ctypes, os, pathlib, signal, sys

class AbortsAtTeardown:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGABRT)

sys.modules["aborts_at_teardown"] = AbortsAtTeardown()
out = pathlib.Path(sys.argv[1])
# a profiler's flush as C registers it (glibc's atexit() is __cxa_atexit with no object)
flush = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: (out / "c-atexit").write_text("ran"))
ctypes.CDLL(None).__cxa_atexit(flush, None, None)
"""


@pytest.mark.parametrize("mode", ["", "full"])
def test_a_profilers_c_atexit_handler_runs_only_when_asked_for(tmp_path, mode):
    """os._exit skips C-level atexit handlers, where Nsight, rocprof or Darshan flush: TRAINSCALE_EXIT=full ends
    a successful worker through C's exit (issue 39), the interpreter's teardown still skipped."""
    script = tmp_path / "profiled.py"
    script.write_text(C_ATEXIT)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC_", "TRAINSCALE_"))}
    proc = subprocess.run(
        [sys.executable, "-m", "trainscale.launch.bootstrap", "--script", str(script), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**environ, **({"TRAINSCALE_EXIT": mode} if mode else {})},
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "c-atexit").exists() == (mode == "full")


def test_a_worker_forked_from_a_process_that_had_initialised_cuda_is_refused():
    from types import SimpleNamespace

    from trainscale.launch.bootstrap import check_no_cuda_inherited

    check_no_cuda_inherited(None)  # no torch in the forkserver
    check_no_cuda_inherited(SimpleNamespace(cuda=SimpleNamespace(_is_in_bad_fork=lambda: False)))
    with pytest.raises(RuntimeError, match="forked from a process that had initialised CUDA"):
        check_no_cuda_inherited(SimpleNamespace(cuda=SimpleNamespace(_is_in_bad_fork=lambda: True)))
    # issue 47 N14: another library's cuInit in the forkserver leaves torch's flag down; the server asked the driver
    torch_unaware = SimpleNamespace(cuda=SimpleNamespace(_is_in_bad_fork=lambda: False))
    check_no_cuda_inherited(torch_unaware, SimpleNamespace(CUDA_DRIVER_INITIALISED=False))
    with pytest.raises(RuntimeError, match="forked from a process that had initialised CUDA"):
        check_no_cuda_inherited(torch_unaware, SimpleNamespace(CUDA_DRIVER_INITIALISED=True))
    from trainscale.launch.bootstrap import cuda_driver_initialised

    assert cuda_driver_initialised() is __import__("torch").cuda.is_initialized()  # here only torch could have


@pytest.mark.parametrize("how, status", [("raise", 1), ("abort", -signal.SIGABRT), ("segfault", -signal.SIGSEGV)])
def test_a_script_that_fails_or_crashes_keeps_its_exit_code_or_signal(tmp_path, how, status):
    error_file = tmp_path / "error.json"
    proc = _bootstrap(tmp_path, how, TORCHELASTIC_ERROR_FILE=str(error_file))
    assert proc.returncode == status, proc.stderr
    assert error_file.exists() == (how == "raise")  # a Python error is recorded; a crash has no traceback


def test_a_worker_whose_agent_is_already_gone_never_runs_the_script(tmp_path):
    """The race die_with_parent guards: the agent died before the worker asked for its death signal."""
    gone = subprocess.Popen(["true"])
    gone.wait()
    worker = {
        "TORCHELASTIC_RUN_ID": "x",
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    proc = _bootstrap(tmp_path, "return", **worker, TRAINSCALE_AGENT=f"{gone.pid}:x")
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert not (tmp_path / "atexit").exists()
    # another launch's value (a job submitted from inside a run inherits it): not this worker's agent
    stale = _bootstrap(tmp_path, "return", **worker, TRAINSCALE_AGENT=f"{gone.pid}:another-run")
    assert stale.returncode == 0, stale.stderr


def test_die_with_parent_asks_the_kernel_for_sigkill(tmp_path):
    probe = (
        "import ctypes, signal; from trainscale.launch.bootstrap import die_with_parent; "
        "assert die_with_parent(); sig = ctypes.c_int(); "
        "ctypes.CDLL(None).prctl(2, ctypes.byref(sig), 0, 0, 0); print(sig.value)"
    )  # PR_GET_PDEATHSIG
    proc = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "TORCHELASTIC_RUN_ID": "x"},
    )
    assert proc.returncode == 0, proc.stderr
    assert int(proc.stdout) == signal.SIGKILL


def test_only_refusals_that_name_a_fix_are_shown_in_one_line():
    """A ConfigError/CheckpointError raised in a rank reads as one line; a hang (CollectiveTimeout, whose
    message names the hung rank and carries its stack) keeps its whole report."""
    from trainscale.errors import CheckpointError, ConfigError, MissingOption, one_line
    from trainscale.errors import is_refusal as _is_trainscale_error
    from trainscale.runtime.hangwatch.watch import CollectiveTimeout

    assert all(_is_trainscale_error(e) for e in (ConfigError("x"), CheckpointError("x"), MissingOption("train", "lr")))
    assert not any(_is_trainscale_error(e) for e in (CollectiveTimeout("rank 1 hung"), ValueError("x")))
    assert (
        one_line(CheckpointError("ckpt-2 is damaged", hint="use --fresh"))
        == "CheckpointError: ckpt-2 is damaged (hint: use --fresh)"
    )


def test_the_error_file_holds_the_first_error_with_its_whole_stack(tmp_path):
    """`trainscale.init()`'s block records an exception before its group closes; the bootstrap records the same
    one again once it has unwound (its whole stack); a later, different error (a script's sys.exit(1) after
    it) keeps the first. The file is never left half written."""
    from trainscale import errors

    environ = {"TORCHELASTIC_ERROR_FILE": str(tmp_path / "error.json")}

    def stack() -> str:
        return json.loads((tmp_path / "error.json").read_text())["message"]["extraInfo"]["py_callstack"]

    def failing_step():
        raise ValueError("shard 3 is corrupt")

    def with_block():
        try:
            failing_step()
        except ValueError as exc:
            errors.record_error(exc, environ)  # as Runtime.__exit__ does
            raise

    try:
        with_block()
    except ValueError as exc:
        assert "test_the_error_file_holds" not in stack()  # the frames up to the with block only
        errors.record_error(exc, environ)  # as the bootstrap does
    assert "test_the_error_file_holds" in stack() and "in failing_step" in stack()
    errors.record_error(SystemExit(1), environ)
    assert json.loads((tmp_path / "error.json").read_text())["message"]["message"] == "ValueError: shard 3 is corrupt"
    errors.record_error(SystemExit(0), environ)  # success records nothing
    assert [p.name for p in tmp_path.iterdir()] == ["error.json"]


def test_a_rank_that_only_lost_its_peer_is_not_named_as_the_cause(tmp_path):
    import cloudpickle

    from trainscale.launch.runner import error_path, failure, read_failures

    gone = "RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:41235"
    error_path(tmp_path, 0).write_bytes(cloudpickle.dumps({"rank": 0, "traceback": gone, "exception": None}))
    summary = "first failing rank: 1 (killed by SIGKILL)"
    killed = failure(read_failures(tmp_path), summary, "train")  # the SIGKILLed rank recorded nothing
    assert killed.rank is None and str(killed).startswith("train failed before any rank recorded an exception")
    own = "Traceback (most recent call last):\nValueError: bad batch"
    error_path(tmp_path, 1).write_bytes(cloudpickle.dumps({"rank": 1, "traceback": own, "exception": None}))
    raised = failure(read_failures(tmp_path), summary, "train")
    assert raised.rank == 1 and "ValueError: bad batch" in str(raised)


def test_the_forkserver_imports_torch_with_the_collector_paused_and_freezes_it():
    """trainscale's own processes import torch without the collector's full passes over its objects, then
    collect as usual; the forkserver's imports leave the collector's care for good (gc.freeze)."""
    code = (
        "import gc, sys\n"
        "from trainscale.launch.bootstrap import collector_paused\n"
        "with collector_paused():\n"
        "    assert not gc.isenabled()\n"
        "assert gc.isenabled()\n"
        "gc.disable()\n"
        "with collector_paused():\n"
        "    pass\n"
        "assert not gc.isenabled()  # a caller's choice is kept\n"
        "gc.enable()\n"
        "import trainscale.launch.forkserver\n"
        "assert gc.isenabled() and gc.get_freeze_count() > 100_000, gc.get_freeze_count()\n"
        "assert {'torch._dynamo', 'torch.distributed.checkpoint'} <= set(sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
