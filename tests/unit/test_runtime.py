"""Device, backend and thread choices, and the single-process Runtime (no process group needed)."""

from __future__ import annotations

import pytest
import torch

import trainscale
from trainscale.env import detect
from trainscale.errors import ConfigError
from trainscale.runtime.device import device_index, pick_backend, pick_device
from trainscale.runtime.threads import threads_per_rank

NODE = {"RANK": "5", "LOCAL_RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "MASTER_ADDR": "h",
        "MASTER_PORT": "1"}


def test_gpu_index_is_local_rank_when_all_gpus_are_visible():
    assert device_index(detect(NODE), visible=4) == 3


def test_gpu_index_wraps_when_ranks_outnumber_gpus():
    assert device_index(detect(NODE), visible=2) == 1


def test_one_visible_gpu_per_task_means_index_zero():
    """SLURM --gpus-per-task / per-rank CUDA_VISIBLE_DEVICES: each task sees only its own GPU."""
    assert device_index(detect(NODE), visible=1) == 0


def test_pick_device_cpu_without_gpus_and_cuda_with():
    env = detect(NODE)
    assert pick_device(env, "auto", visible=0) == torch.device("cpu")
    assert pick_device(env, "auto", visible=4) == torch.device("cuda", 3)
    assert pick_device(env, "cpu", visible=4) == torch.device("cpu")


def test_asking_for_cuda_without_gpus_names_the_fix():
    with pytest.raises(ConfigError, match="device='cpu'"):
        pick_device(detect(NODE), "cuda", visible=0)


def test_unknown_device_is_refused():
    with pytest.raises(ConfigError, match="not supported"):
        pick_device(detect({}), "tpu")


def test_backend_follows_the_device():
    assert pick_backend(torch.device("cuda", 0)) == "nccl"
    assert pick_backend(torch.device("cpu")) == "gloo"
    with pytest.raises(ConfigError, match="use backend='gloo'"):
        pick_backend(torch.device("cpu"), "nccl")


def test_the_mixed_backend_is_kept_on_gpus_and_becomes_gloo_on_cpu():
    from trainscale.runtime.device import MIXED_BACKEND

    assert pick_backend(torch.device("cuda", 0), MIXED_BACKEND) == MIXED_BACKEND
    assert pick_backend(torch.device("cpu"), MIXED_BACKEND) == "gloo"


def test_fsdp_cpu_offload_asks_for_gloo_beside_nccl_and_refuses_an_nccl_only_group():
    from trainscale.strategies import process_group_backend
    from trainscale.strategies.fsdp import check_offload_backend

    assert process_group_backend("fsdp:cpu_offload=true") == "cpu:gloo,cuda:nccl"
    assert process_group_backend("fsdp") is None and process_group_backend("ddp") is None
    with pytest.raises(ConfigError, match="needs a process group with gloo") as caught:
        check_offload_backend(True, "cuda", "nccl")
    assert 'backend="cpu:gloo,cuda:nccl"' in caught.value.hint
    check_offload_backend(True, "cuda", "cpu:gloo,cuda:nccl")
    check_offload_backend(True, "cpu", "gloo")


@pytest.mark.parametrize("cores, ranks, expected", [(64, 8, 8), (2, 4, 1), (56, 8, 7), (7, 2, 3)])
def test_threads_per_rank(cores, ranks, expected):
    assert threads_per_rank(ranks, cores) == expected


def test_single_process_runtime(monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "")  # recorded, so the value init() sets is undone afterwards
    monkeypatch.delenv("OMP_NUM_THREADS")
    with trainscale.init(environ={}, seed=3) as rt:
        assert (rt.rank, rt.world_size, rt.is_main, rt.is_distributed, rt.backend) == (0, 1, True, False, None)
        assert rt.mean(4.0) == 4.0
        with rt.rank_zero_first():
            pass
        rt.barrier()
        rt.print("hello")
        first = torch.rand(1)
    assert "hello" in capsys.readouterr().out
    torch.manual_seed(3)
    assert torch.equal(first, torch.rand(1))  # seeded


def test_omp_threads_set_when_unset_and_said_once(monkeypatch, capsys):
    monkeypatch.setenv("OMP_NUM_THREADS", "")  # recorded, so the value init() sets is undone afterwards
    monkeypatch.delenv("OMP_NUM_THREADS")
    import os

    with trainscale.init(environ={}) as rt:
        assert os.environ["OMP_NUM_THREADS"] == str(threads_per_rank(1))
        assert any("OMP_NUM_THREADS" in n for n in rt.notes)
    assert capsys.readouterr().err.count("OMP_NUM_THREADS") == 1


def test_users_omp_threads_is_left_alone(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    with trainscale.init(environ={}) as rt:
        assert rt.notes == [] and torch.get_num_threads() == 1


def test_bad_timeout_is_refused():
    with pytest.raises(ConfigError, match="timeout_s"):
        trainscale.init(environ={}, timeout_s=0)


def test_attempt_counts_slurm_requeues_once_in_both_launch_modes(monkeypatch):
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    srun_task = {"SLURM_JOB_ID": "9", "SLURM_STEP_ID": "0", "SLURM_PROCID": "0", "SLURM_LOCALID": "0",
                 "SLURM_NTASKS": "1", "SLURM_NODEID": "0", "SLURM_TASKS_PER_NODE": "1", "SLURM_JOB_NODELIST": "n1",
                 "SLURM_RESTART_COUNT": "1"}
    torchrun_worker = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "TORCHELASTIC_RESTART_COUNT": "2"}
    with trainscale.init(environ=srun_task, set_threads=False) as rt:
        assert rt.attempt == 1
    with trainscale.init(environ=torchrun_worker, set_threads=False) as rt:
        assert rt.attempt == 3  # one requeue by SLURM + two restarts by the agent
