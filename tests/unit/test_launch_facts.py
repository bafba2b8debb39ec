"""The launch facts above env/ come from LaunchEnv (nothing above env/ reads os.environ for them), and
three defects found beside them: the rank under mpirun, a property read that installed signal
handlers, and handlers restored to SIG_DFL (a SIGUSR1 after close() killed the process)."""

from __future__ import annotations

import os
import signal

import pytest

import trainscale
from trainscale.env import detect
from trainscale.errors import LaunchError
from trainscale.train import fault

MPIRUN = {
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "MASTER_ADDR": "127.0.0.1",
    "MASTER_PORT": "29500",
}


def test_the_job_facts_are_read_once_by_env_whatever_the_launcher():
    environ = {
        **MPIRUN,
        "SLURM_RESTART_COUNT": "2",
        "SLURM_JOB_ID": "77",
        "SLURM_ARRAY_JOB_ID": "70",
        "SLURM_ARRAY_TASK_ID": "3",
        "TRAINSCALE_JOB_DIR": "/runs/x/job-77",
        "TRAINSCALE_RUN_DIR": "/runs/x",
        "TRAINSCALE_ON_SIGNAL": "stop",
        "TRAINSCALE_MAX_REQUEUES": "3",
        "TRAINSCALE_PREEMPT_SIGNALS": "usr2",
        "TRAINSCALE_PREEMPT_CHECK_EVERY": "4",
    }
    env = detect(environ)
    assert (env.source, env.rank, env.requeue_count, env.attempt) == ("mpi", 1, 2, 2)
    assert (env.job_dir, env.run_dir, env.requeue_job) == ("/runs/x/job-77", "/runs/x", "70_3")
    assert (env.on_signal, env.max_requeues, env.preempt_signals, env.preempt_check_every) == (
        "stop",
        3,
        ("SIGUSR2",),
        4,
    )
    torchrun = detect(
        {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "TORCHELASTIC_RESTART_COUNT": "1",
            "TORCHELASTIC_USE_AGENT_STORE": "True",
            "SLURM_RESTART_COUNT": "1",
        }
    )
    assert torchrun.agent_store and torchrun.attempt == 2  # one requeue by SLURM + one restart by the agent
    plain = detect({})
    assert (plain.job_dir, plain.requeue_job, plain.agent_store, plain.attempt) == (None, None, False, 0)


@pytest.mark.parametrize(
    "variable, value, fragment",
    [
        ("TRAINSCALE_PREEMPT_SIGNALS", "SIGUSR9", "names 'SIGUSR9', which is not a signal"),
        ("TRAINSCALE_MAX_REQUEUES", "three", "TRAINSCALE_MAX_REQUEUES='three' is not an integer"),
    ],
)
def test_a_bad_job_fact_names_the_variable(variable, value, fragment):
    with pytest.raises(LaunchError, match=fragment):
        detect({variable: value})


def test_a_fault_targets_the_launchs_own_rank_under_mpirun():
    """mpirun sets no RANK: the fault hook used to take every process for rank 0."""
    planned = fault.planned({fault.VAR: "raise:rank=1:step=3"})
    rank1, rank0 = detect(MPIRUN), detect({**MPIRUN, "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_RANK": "0"})
    fault.maybe_inject(3, rank0, planned)  # not this rank: nothing happens
    fault.maybe_inject(2, rank1, planned)  # not this step
    with pytest.raises(RuntimeError, match="injected fault at step 3 on rank 1"):
        fault.maybe_inject(3, rank1, planned)


def test_reading_rt_preemption_installs_nothing():
    before = signal.getsignal(signal.SIGUSR1)
    with trainscale.init(environ={}, set_threads=False) as rt:
        assert rt.preemption is None and signal.getsignal(signal.SIGUSR1) is before
        pre = rt.handle_preemption()
        assert rt.preemption is pre and rt.handle_preemption() is pre  # installed once, on request
        assert signal.getsignal(signal.SIGUSR1) == pre._handle
    assert signal.getsignal(signal.SIGUSR1) is before


def test_close_puts_back_the_previous_handler_so_a_later_sigusr1_does_not_kill():
    seen = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    try:
        with trainscale.init(environ={}, set_threads=False) as rt:
            rt.handle_preemption()
            os.kill(os.getpid(), signal.SIGUSR1)
            assert rt.preemption.requested() and seen == []  # the flag, not the previous handler
        handler = signal.getsignal(signal.SIGUSR1)
        assert handler not in (signal.SIG_DFL, None), "SIG_DFL would end the process on the next SIGUSR1"
        os.kill(os.getpid(), signal.SIGUSR1)
        assert seen == [signal.SIGUSR1]
    finally:
        signal.signal(signal.SIGUSR1, previous)
