"""Device mapping on GPUs: local rank r drives cuda:r, the r-th *visible* GPU, with and without
``CUDA_VISIBLE_DEVICES``; one visible GPU per rank means cuda:0; two ranks never share a GPU."""

from __future__ import annotations

import pytest
from helpers.gpu import gpu_id, trainscale
from helpers.multiproc import run_on_ranks


def where_am_i(device: str) -> dict:
    import torch

    import trainscale as ts

    with ts.init(device=device, timeout_s=120) as rt:
        seen = {"device": str(rt.device), "backend": rt.backend, "gpu": None}
        if rt.device.type == "cuda":
            props = torch.cuda.get_device_properties(rt.device)
            seen["gpu"] = str(getattr(props, "uuid", None) or f"{props.name} {getattr(props, 'pci_bus_id', '')}")
        rt.barrier()  # NCCL really works between these devices
        return seen


def test_all_gpus_visible_local_rank_r_drives_cuda_r(gpus):
    gpus.need(2)
    n = gpus.count
    seen = run_on_ranks(where_am_i, n, gpus.device, timeout=300)
    if gpus.on_cpu:
        assert all(s["device"] == "cpu" for s in seen.values())
        return
    assert [seen[r]["device"] for r in range(n)] == [f"cuda:{r}" for r in range(n)]
    assert {s["backend"] for s in seen.values()} == {"nccl"}
    assert [seen[r]["gpu"] for r in range(n)] == [gpu_id(r) for r in range(n)]


@pytest.mark.needs_cuda
def test_a_visible_list_maps_rank_0_to_the_first_listed_gpu(gpus):
    """CUDA_VISIBLE_DEVICES=1,0: rank 0 runs on cuda:0, which is the node's GPU 1."""
    gpus.need(2)
    seen = run_on_ranks(where_am_i, 2, "cuda", env={"CUDA_VISIBLE_DEVICES": "1,0"}, timeout=300)
    assert seen[0]["device"] == "cuda:0" and seen[0]["gpu"] == gpu_id(1)
    assert seen[1]["device"] == "cuda:1" and seen[1]["gpu"] == gpu_id(0)


@pytest.mark.needs_cuda
def test_one_visible_gpu_per_rank_is_cuda_0_whatever_the_local_rank(gpus):
    """As SLURM's --gpus-per-task=1 makes it: every rank sees only its own GPU."""
    gpus.need(2)
    n = gpus.count
    seen = run_on_ranks(
        where_am_i, n, "cuda", rank_env={r: {"CUDA_VISIBLE_DEVICES": str(r)} for r in range(n)}, timeout=300
    )
    assert all(seen[r]["device"] == "cuda:0" for r in range(n))
    assert [seen[r]["gpu"] for r in range(n)] == [gpu_id(r) for r in range(n)]


@pytest.mark.needs_cuda
def test_more_ranks_than_visible_gpus_are_refused_before_nccl(gpus, tmp_path):
    """The launcher refuses before any rank starts (launch/torchrun.py nproc_fits): with CUDA_VISIBLE_DEVICES
    narrowed to one GPU, and with more ranks than the node's GPUs."""
    script = tmp_path / "probe.py"
    script.write_text("import trainscale\nwith trainscale.init(timeout_s=60):\n    pass\n")
    done = trainscale(
        tmp_path,
        "run",
        "--nproc-per-node",
        "2",
        "--log-dir",
        "logs",
        str(script),
        CUDA_VISIBLE_DEVICES="0",
        timeout=300,
    )
    assert done.returncode != 0
    assert "--nproc-per-node 2 but this node shows 1 GPU(s): local rank 1 and above would have none" in done.stderr, (
        done.stderr[-3000:]
    )
    n = gpus.count
    unnarrowed = trainscale(
        tmp_path, "run", "--nproc-per-node", str(n + 1), "--log-dir", "logs2", str(script), timeout=300
    )
    assert unnarrowed.returncode != 0
    assert f"--nproc-per-node {n + 1} but this node shows {n} GPU(s): local rank {n} and above" in unnarrowed.stderr
