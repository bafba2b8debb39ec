"""Launch-environment detection on the variable sets each launcher really sets."""

from __future__ import annotations

import pytest

from trainscale.env import detect
from trainscale.env.slurm import expand_nodelist, expand_tasks_per_node, job_port
from trainscale.errors import ConfigError, LaunchError

TORCHRUN = {
    "RANK": "5",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "node7",
    "MASTER_PORT": "29500",
    "TORCHELASTIC_RUN_ID": "abc",
    "TORCHELASTIC_RESTART_COUNT": "2",
}
SRUN_TASK = {
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "0",
    "SLURM_PROCID": "5",
    "SLURM_LOCALID": "2",
    "SLURM_NTASKS": "7",
    "SLURM_NODEID": "1",
    "SLURM_NNODES": "3",
    "SLURM_TASKS_PER_NODE": "3(x2),1",
    "SLURM_JOB_NODELIST": "gpu[07-08],cpu01",
}


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("4", [4]),
        ("2(x3),1", [2, 2, 2, 1]),
        ("8(x2)", [8, 8]),
        ("1,2,3", [1, 2, 3]),
    ],
)
def test_tasks_per_node_expansion(spec, expected):
    assert expand_tasks_per_node(spec) == expected


def test_tasks_per_node_garbage_is_a_clear_error():
    with pytest.raises(LaunchError, match="SLURM_TASKS_PER_NODE"):
        expand_tasks_per_node("2(y3)")


@pytest.mark.parametrize(
    "nodelist, expected",
    [
        ("n[1-2]", ["n1", "n2"]),
        ("gpu[07-09,11],cpu01", ["gpu07", "gpu08", "gpu09", "gpu11", "cpu01"]),
        ("nid[005000-005001]", ["nid005000", "nid005001"]),
    ],
)
def test_nodelist_expansion(nodelist, expected):
    assert expand_nodelist(nodelist) == expected


def test_single_process_when_nothing_is_set():
    env = detect({})
    assert (env.source, env.rank, env.world_size, env.is_distributed) == ("single", 0, 1, False)


def test_torchrun_fields():
    env = detect(TORCHRUN)
    assert env.source == "torchrun"
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (5, 1, 8, 4)
    assert (env.node_rank, env.num_nodes, env.restart_count) == (1, 2, 2)
    assert (env.master_addr, env.master_port) == ("node7", 29500)


def test_srun_task_fields_from_compressed_lists():
    env = detect(SRUN_TASK)
    assert env.source == "slurm"
    assert (env.rank, env.local_rank, env.world_size) == (5, 2, 7)
    assert (env.node_rank, env.num_nodes, env.local_world_size) == (1, 3, 3)
    assert env.master_addr == "gpu07"  # first host of the allocation
    assert env.master_port == job_port("4242")


def test_srun_task_uses_exported_master_port():
    env = detect({**SRUN_TASK, "MASTER_PORT": "31337"})
    assert env.master_port == 31337


def test_torchrun_inside_slurm_wins():
    env = detect({**SRUN_TASK, **TORCHRUN})
    assert env.source == "torchrun" and env.rank == 5 and env.world_size == 8


@pytest.mark.parametrize("step", ["batch", "extern", "4294967294"])
def test_batch_step_is_not_a_distributed_launch(step):
    env = detect({**SRUN_TASK, "SLURM_STEP_ID": step})
    assert env.source == "single" and env.world_size == 1


def test_salloc_shell_without_step_is_not_a_launch():
    shell = {k: v for k, v in SRUN_TASK.items() if k != "SLURM_STEP_ID"}
    assert detect(shell).source == "single"


def test_open_mpi():
    env = detect(
        {
            "OMPI_COMM_WORLD_RANK": "3",
            "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "1",
            "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
            "MASTER_ADDR": "h1",
            "MASTER_PORT": "1234",
        }
    )
    assert (env.source, env.rank, env.local_rank, env.node_rank, env.num_nodes) == ("mpi", 3, 1, 1, 2)


def test_pmi():
    env = detect(
        {
            "PMI_RANK": "2",
            "PMI_SIZE": "4",
            "MPI_LOCALRANKID": "0",
            "MPI_LOCALNRANKS": "2",
            "MASTER_ADDR": "h1",
            "MASTER_PORT": "1234",
        }
    )
    assert (env.source, env.rank, env.world_size, env.local_world_size, env.node_rank) == ("mpi", 2, 4, 2, 1)


def test_slurm_beats_the_pmi_variables_it_exports():
    env = detect({**SRUN_TASK, "PMI_RANK": "5", "PMI_SIZE": "7"})
    assert env.source == "slurm"


def test_override_forces_a_detector():
    env = detect(
        {
            **SRUN_TASK,
            "OMPI_COMM_WORLD_RANK": "1",
            "OMPI_COMM_WORLD_SIZE": "2",
            "MASTER_ADDR": "x",
            "MASTER_PORT": "1",
            "TRAINSCALE_LAUNCHER": "mpi",
        }
    )
    assert env.source == "mpi" and env.rank == 1


def test_override_with_unknown_name_lists_valid_ones():
    with pytest.raises(ConfigError, match="valid choices|did you mean"):
        detect({"TRAINSCALE_LAUNCHER": "srunn"})


def test_override_without_its_variables():
    with pytest.raises(ConfigError, match="unset TRAINSCALE_LAUNCHER"):
        detect({"TRAINSCALE_LAUNCHER": "slurm"})


def test_inconsistent_rank_is_a_clear_error():
    with pytest.raises(LaunchError, match="outside 0..3"):
        detect({**TORCHRUN, "RANK": "4", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"})


def test_non_integer_variable_names_itself():
    with pytest.raises(LaunchError, match="WORLD_SIZE='two'"):
        detect({**TORCHRUN, "WORLD_SIZE": "two"})


def test_distributed_without_master_is_refused():
    bare = {k: v for k, v in TORCHRUN.items() if not k.startswith("MASTER")}
    with pytest.raises(LaunchError, match="no master address"):
        detect(bare)
