"""Device, backend and thread choices, and the single-process Runtime (no process group needed)."""

from __future__ import annotations

import os

import pytest
import torch

import trainscale
from trainscale.env import detect
from trainscale.errors import ConfigError
from trainscale.runtime.device import device_index, pick_backend, pick_device
from trainscale.runtime.threads import threads_per_rank

NODE = {
    "RANK": "5",
    "LOCAL_RANK": "3",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4",
    "MASTER_ADDR": "h",
    "MASTER_PORT": "1",
}


def test_gpu_index_is_local_rank_when_all_gpus_are_visible():
    assert device_index(detect(NODE), visible=4) == 3


def test_ranks_outnumbering_gpus_are_refused_instead_of_sharing_one():
    """Wrapping local rank 3 onto GPU 1 put two ranks on one GPU, which NCCL refuses later with
    "Duplicate GPU detected"; it is refused before the process group, naming the fix."""
    with pytest.raises(ConfigError, match="local rank 3 has no GPU of its own: 4 ranks on this node but 2") as caught:
        device_index(detect(NODE), visible=2)
    assert "--nproc-per-node gpu" in caught.value.hint


def test_torchrun_workers_sharing_the_only_gpu_are_refused():
    workers = {**NODE, "TORCHELASTIC_RUN_ID": "x", "GROUP_RANK": "1"}
    env = detect(workers)
    with pytest.raises(ConfigError, match="4 local ranks would share the only visible GPU"):
        device_index(env, visible=1, environ=workers)
    # a per-rank CUDA_VISIBLE_DEVICES, or srun tasks with one GPU each, are the legitimate one-GPU cases
    assert device_index(env, visible=1, environ={**workers, "CUDA_VISIBLE_DEVICES": "3"}) == 0
    assert device_index(detect(NODE), visible=1, environ=NODE) == 0


def test_visible_list_maps_local_rank_to_the_rth_visible_gpu_index():
    """With CUDA_VISIBLE_DEVICES=4,5,6,7 torch numbers the visible GPUs 0..3: local rank r -> cuda:r."""
    env = detect(NODE)
    assert pick_device(env, "auto", visible=4, environ={"CUDA_VISIBLE_DEVICES": "4,5,6,7"}) == torch.device("cuda", 3)


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


@pytest.mark.parametrize("spec", ["fsdp:cpu_offload=true", "fsdp:mixed_precision=bf16,cpu_offload=true"])
def test_one_gpu_fsdp_with_cpu_offload_shards_over_a_group_of_its_own_with_gloo(spec, monkeypatch):
    """issue 39 defect 7: alone on one GPU, fsdp with cpu_offload was refused ("needs a process group with
    gloo ... but this one is None": the runtime has no group, the strategy's own was nccl-only) or, without
    mixed precision, not offloaded at all. The GPU itself is faked at its boundaries (the module's .to, the
    group, FSDP's sharding); tests/gpu/test_gpu_strategies.py runs it for real. Issue 47 N8: the whole model was
    moved to the GPU first, so a model that fits only offloaded ran out of GPU memory before sharding."""
    from types import SimpleNamespace

    from trainscale.runtime.device import MIXED_BACKEND
    from trainscale.strategies import fsdp, get_strategy
    from trainscale.strategies.base import OptimizerSpec

    class Reached(Exception):
        pass

    moved = []

    class OnGpu(torch.nn.Linear):
        def to(self, *args, **kwargs):
            moved.append(args)
            return self

    groups = []
    monkeypatch.setattr(fsdp, "one_rank_group", lambda rt, backend=None: groups.append(backend))
    monkeypatch.setattr(fsdp.dist, "is_initialized", lambda: bool(groups))
    monkeypatch.setattr(fsdp.dist, "get_backend", lambda *args: groups[-1] or "nccl")
    monkeypatch.setattr(fsdp, "fsdp2", lambda: (_ for _ in ()).throw(Reached()))  # past the group's check
    rt = SimpleNamespace(device=torch.device("cuda", 0), is_distributed=False, backend=None)
    with pytest.raises(Reached):
        get_strategy(spec).wrap(OnGpu(4, 4), OptimizerSpec(torch.optim.SGD, {"lr": 0.1}), rt)
    assert groups == [MIXED_BACKEND]
    assert moved == []  # fully_shard moves each unit to the GPU in turn, its shards then to host memory


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
    srun_task = {
        "SLURM_JOB_ID": "9",
        "SLURM_STEP_ID": "0",
        "SLURM_PROCID": "0",
        "SLURM_LOCALID": "0",
        "SLURM_NTASKS": "1",
        "SLURM_NODEID": "0",
        "SLURM_TASKS_PER_NODE": "1",
        "SLURM_JOB_NODELIST": "n1",
        "SLURM_RESTART_COUNT": "1",
    }
    torchrun_worker = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "SLURM_RESTART_COUNT": "1",
    }  # the job's variables reach torchrun's workers too
    with trainscale.init(environ=srun_task, set_threads=False) as rt:
        assert rt.attempt == 1
    with trainscale.init(environ=torchrun_worker, set_threads=False) as rt:
        assert rt.attempt == 3  # one requeue by SLURM + two restarts by the agent


def test_deterministic_mode_sets_what_bitwise_gpu_runs_need_and_says_so(monkeypatch, capsys, tmp_path):
    # torch may point TORCHINDUCTOR_CACHE_DIR somewhere on first use; monkeypatch restores it
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", "")  # recorded, so the value init() sets is undone afterwards
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    try:
        with trainscale.init(environ={}, set_threads=False, deterministic=True):
            import os

            assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
            assert torch.are_deterministic_algorithms_enabled()
            assert not torch.backends.cudnn.benchmark and torch.backends.cudnn.deterministic
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
    err = capsys.readouterr().err
    assert "CUBLAS_WORKSPACE_CONFIG=:4096:8" in err and "deterministic algorithms on" in err


def test_a_users_cublas_workspace_setting_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    from trainscale.runtime.determinism import enable_determinism

    environ = {"CUBLAS_WORKSPACE_CONFIG": ":16:8"}
    try:
        notes = enable_determinism(environ)
    finally:
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.deterministic = False
    assert environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8" and not any("CUBLAS" in n for n in notes)


def test_fsdp2_is_imported_from_the_older_composable_package_too(monkeypatch, tmp_path):
    """torch 2.4-2.5 (inside the supported range) keep fully_shard under torch.distributed._composable."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    import torch.distributed.fsdp as public
    from torch.distributed._composable import fsdp as composable

    from trainscale.strategies.fsdp import fsdp2

    assert fsdp2().fully_shard is public.fully_shard
    monkeypatch.delattr(public, "fully_shard")  # as below torch 2.6
    api = fsdp2()
    assert api.fully_shard is composable.fully_shard and api.MixedPrecisionPolicy is composable.MixedPrecisionPolicy


def test_a_single_process_node_has_the_cpus_it_may_run_on():
    from types import SimpleNamespace

    from trainscale.runtime.threads import node_cpus, usable_cores

    assert node_cpus(SimpleNamespace(is_distributed=False)) == usable_cores() == len(os.sched_getaffinity(0))


def test_a_group_kept_past_its_close_is_let_go_at_the_next_close():
    """A clean close keeps its groups referenced (a model freed later must not tear gloo down under the GIL:
    tests/integration/test_runtime_ranks.py), but only until the next close: a notebook or a test process
    that opens and closes many runtimes holds one retired group's threads, not one set per run."""
    import torch._dynamo  # noqa: F401  (imported while a group exists, torch's DDP pins that group for good)
    import torch.distributed as dist

    def threads() -> int:
        return len(os.listdir(f"/proc/{os.getpid()}/task"))

    counts = []
    for _ in range(4):
        with trainscale.init(environ={}, set_threads=False) as rt:
            dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
            rt.owns_process_group = True
            model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(2, 2))
        del model
        counts.append(threads())
    assert counts == [counts[0]] * 4, counts
