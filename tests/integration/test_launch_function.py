"""``trainscale.launch(fn, *args, nproc=N)``: the notebook shipped in examples/ run by a real Jupyter kernel
(nbclient + ipykernel), its functions defined in the notebook itself; and from a plain script, keyword
arguments through functools.partial, a rank killed by a signal reported without a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

NOTEBOOK = Path(__file__).parents[2] / "examples" / "launch.ipynb"


def _output(cell) -> str:
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")


@pytest.mark.slow
def test_the_example_notebook_runs_a_notebook_function_on_two_ranks(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute(env={**os.environ, "OMP_NUM_THREADS": "1"})
    code = [c for c in notebook.cells if c.cell_type == "code"]
    results = _output(code[2])
    assert "rank 0 of 2: mean loss" in results and "rank 1 of 2: mean loss" in results, results
    losses = {line.split()[-1] for line in results.splitlines() if line.startswith("rank ")}
    assert len(losses) == 1 and float(losses.pop()) < 0.5, results  # the same mean on both ranks, trained down
    assert "rank 1 failed: RuntimeError('rank 1 gives up')" in _output(code[3]), _output(code[3])
    assert (tmp_path / "trainscale-runs").is_dir()  # the ranks' logs, beside the notebook


SCRIPT = """
import functools, os, signal, sys
import trainscale

def scaled(x, *, factor):
    with trainscale.init() as rt:
        return rt.rank * factor + x

def killed():
    with trainscale.init() as rt:
        if rt.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        rt.barrier()

if __name__ == "__main__":
    print("RESULT", trainscale.launch(functools.partial(scaled, factor=10), 1, nproc=2), flush=True)
    try:
        trainscale.launch(killed, nproc=2)
    except trainscale.RankFailed as error:
        print("FAILED", error.rank, "|", error, flush=True)
"""


@pytest.mark.slow
def test_from_a_script_results_by_rank_and_a_killed_rank(tmp_path):
    (tmp_path / "run.py").write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, "run.py"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "RESULT [1, 11]" in done.stdout, done.stdout
    # SIGKILL leaves no exception to send back: the launcher's summary names the rank and the signal
    assert "FAILED None | killed failed before any rank recorded an exception:" in done.stdout, done.stdout
    assert "first failing rank: 1" in done.stdout and "SIGKILL" in done.stdout, done.stdout


AGAIN = """
import json, os, sys
import torch
import trainscale

def seen():  # what the worker was given, before trainscale.init() would set anything
    import numpy
    with open("/proc/self/comm") as comm:
        return (os.environ.get("CHOSEN"), os.getcwd(), torch.get_num_threads(), os.getppid(), comm.read().strip(),
                os.getsid(0) == os.getpid(), int(numpy.random.randint(1 << 30)))

if __name__ == "__main__":
    from trainscale.launch import bootstrap
    bootstrap.FORK_OWN_WORKERS = True  # as trainscale's command line does in its own process
    os.environ.update(CHOSEN="first", OMP_NUM_THREADS="1")
    first = trainscale.launch(seen, nproc=2)
    os.environ.update(CHOSEN="second", OMP_NUM_THREADS="2")
    os.chdir(sys.argv[1])
    second = trainscale.launch(seen, nproc=2)
    print("RESULT", json.dumps({"first": first, "second": second, "launcher": os.getpid()}), flush=True)
"""


@pytest.mark.slow
def test_a_second_launch_in_one_process_forks_from_the_same_forkserver_with_the_environment_of_now(tmp_path):
    """Where trainscale's command line owns the process, trainscale's own workers are forked from one
    forkserver that imported torch once; a later launch from the same process (`trainscale bench`'s next
    configuration) must not see the environment, directory or thread count of the launch that started
    that forkserver. (launch(fn)'s runner is trainscale's own module; here it carries the probe.)"""
    (tmp_path / "run.py").write_text(AGAIN)
    (tmp_path / "later").mkdir()
    done = subprocess.run(
        [sys.executable, "run.py", str(tmp_path / "later")], cwd=tmp_path, capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stdout + done.stderr
    line = next(line for line in done.stdout.splitlines() if line.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])
    first, second, launcher = result["first"], result["second"], result["launcher"]
    assert [r[0] for r in first] == ["first"] * 2 and [r[0] for r in second] == ["second"] * 2, line
    assert {r[1] for r in first} == {str(tmp_path)} and {r[1] for r in second} == {str(tmp_path / "later")}, line
    assert [r[2] for r in first] == [1, 1] and [r[2] for r in second] == [2, 2], line  # OMP_NUM_THREADS of each launch
    assert [r[4] for r in first + second] == ["ts-rank0", "ts-rank1"] * 2, line  # named for ps and top
    assert all(r[5] for r in first + second), line  # each in a session of its own, as torch starts a script's
    assert len({r[6] for r in first + second}) == 4, line  # numpy's generator seeded anew in each, as when fresh
    parents = {r[3] for r in first + second}
    assert len(parents) == 1 and launcher not in parents, line  # one forkserver forked all four, not the launcher
