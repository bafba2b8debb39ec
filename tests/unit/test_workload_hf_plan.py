"""hf-finetune's checks before launch: the device the ranks will have, and the batch it is sized by."""

from __future__ import annotations

import os

import pytest

from trainscale.bench.study import StudySpec
from trainscale.bench.study import plan as plan_study
from trainscale.errors import ConfigError
from trainscale.workloads.hf_finetune import plan


def test_fsdp_planned_for_gpu_ranks_is_accepted_on_a_machine_without_gpus(tmp_path):
    # a login node plans a SLURM job with GPUs: the job's resources decide, not the login node
    run = plan(["--strategy", "fsdp", "--output-dir", str(tmp_path / "o")], 4, gpus=True)
    assert run.use_cpu is False and run.strategy_args["fsdp"] is True


def test_fsdp_planned_for_cpu_ranks_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="needs GPUs"):
        plan(["--strategy", "fsdp", "--output-dir", str(tmp_path / "o")], 4, gpus=False)


def test_a_per_rank_batch_from_the_environment_is_refused_with_a_hint_for_this_world_size(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINSCALE_TRAIN_BATCH_SIZE", "8")
    with pytest.raises(ConfigError, match="got --batch-size 8") as caught:
        plan(["--global-batch", "16", "--output-dir", str(tmp_path / "o")], 4)
    assert "--global-batch 16: 4 per device on 4 rank(s)" in caught.value.hint


def test_bench_sizes_hf_finetune_by_its_global_batch(tmp_path):
    study = plan_study(StudySpec(workload="hf-finetune", configs="1,2", batch_size=4, out_dir=tmp_path / "s"))
    sizes = {run.config.world_size: run.args[run.args.index("--global-batch") + 1] for run in study.runs}
    assert sizes == {1: "4", 2: "8"} and all("--batch-size" not in run.args for run in study.runs)


class _Started(Exception):
    """Raised by the stand-in for trainscale.init: the test only needs what it was asked for."""


def test_fsdp_cpu_offload_on_gpus_asks_trainscale_for_gloo_beside_nccl(tmp_path, monkeypatch):
    """The Trainer's gradient clipping on CPU-offloaded shards is a CPU collective: an nccl-only group
    had no backend for it. torch's device count is the one faked seam (a GPU node)."""
    import torch

    import trainscale
    from trainscale.workloads import hf_finetune

    asked = {}

    def init(**kwargs):
        asked.update(kwargs)
        raise _Started

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(trainscale, "init", init)
    with pytest.raises(_Started):
        hf_finetune.main(["--strategy", "fsdp:cpu_offload=true", "--output-dir", str(tmp_path / "o")])
    assert asked["backend"] == "cpu:gloo,cuda:nccl"
    assert hf_finetune.trainer_backend(asked["backend"]) == "nccl"  # the one name TrainingArguments takes
    asked.clear()
    with pytest.raises(_Started):
        hf_finetune.main(["--strategy", "ddp", "--output-dir", str(tmp_path / "o")])
    assert asked["backend"] is None  # the device's default (nccl) for everything else


def test_a_task_that_sees_only_its_own_gpu_barriers_on_it(monkeypatch):
    """srun mode narrows each task to one GPU: accelerate's barrier on cuda:{LOCAL_RANK} would ask local rank 1
    for cuda:1, which that task does not have (issue 22 item 4). Its barrier becomes trainscale's, on cuda:0."""
    from types import SimpleNamespace

    import torch
    from accelerate.state import PartialState

    from trainscale.workloads.hf_finetune import accelerate_on_own_gpu

    monkeypatch.setattr(PartialState, "wait_for_everyone", PartialState.wait_for_everyone)  # restored after
    for name in ("ACCELERATE_TORCH_DEVICE", "ACCELERATE_BYPASS_DEVICE_MAP"):  # set here, restored after
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    barriers = []
    torchrun_worker = SimpleNamespace(device=torch.device("cuda", 1), local_rank=1, barrier=lambda: barriers.append(1))
    accelerate_on_own_gpu(torchrun_worker)  # sees every GPU of the node: accelerate's own barrier is right
    assert PartialState.wait_for_everyone.__module__.startswith("accelerate")
    assert "ACCELERATE_BYPASS_DEVICE_MAP" not in os.environ
    monkeypatch.delenv("ACCELERATE_TORCH_DEVICE")
    srun_task = SimpleNamespace(device=torch.device("cuda", 0), local_rank=1, barrier=lambda: barriers.append(0))
    accelerate_on_own_gpu(srun_task)
    PartialState.wait_for_everyone(SimpleNamespace(use_distributed=True))
    assert barriers == [0] and os.environ["ACCELERATE_TORCH_DEVICE"] == "cuda:0"


DDP_IDS = """
import os, sys, torch, torch.distributed as dist
from types import SimpleNamespace
from accelerate import Accelerator
from trainscale.workloads.hf_finetune import accelerate_on_own_gpu
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
if sys.argv[2] == "srun":  # a task that sees one GPU, local rank 1
    accelerate_on_own_gpu(SimpleNamespace(device=torch.device("cuda", 0), local_rank=1, barrier=dist.barrier))
    os.environ.pop("ACCELERATE_TORCH_DEVICE")  # this machine has no cuda:0 to put the model on
seen = {}
class DDP(torch.nn.Module):  # the boundary: what accelerate would hand torch's DDP
    def __init__(self, module, **kwargs):
        super().__init__()
        seen.update(kwargs)
torch.nn.parallel.DistributedDataParallel = DDP
Accelerator.multi_device = property(lambda self: True)  # one process stands for one of a job's many
Accelerator(cpu=True).prepare_model(torch.nn.Linear(2, 2))
print(seen["device_ids"])
"""


@pytest.mark.parametrize("mode, device_ids", [("torchrun", "[1]"), ("srun", "None")])
def test_accelerate_wraps_ddp_on_the_tasks_own_gpu(mode, device_ids, tmp_path):
    """issue 39 defect 2: accelerate gave DDP device_ids=[LOCAL_RANK]; a task that sees only its own GPU
    (srun mode) has no cuda:1, and every task but a node's first crashed in the Trainer's DDP path."""
    import subprocess
    import sys

    env = {**os.environ, "LOCAL_RANK": "1", "RANK": "0", "WORLD_SIZE": "1"}
    env.pop("ACCELERATE_BYPASS_DEVICE_MAP", None)
    done = subprocess.run(
        [sys.executable, "-c", DDP_IDS, str(tmp_path / "store"), mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-1] == device_ids
