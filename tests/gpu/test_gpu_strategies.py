"""DDP, ZeRO-1, FSDP (fp32, bf16, fp16 with loss scaling, CPU offload) and DeepSpeed on GPUs.

Tolerances (docs/gpu.md): ZeRO-1 = DDP bitwise; FSDP fp32 and DeepSpeed within 1e-5 of DDP (max
|Δ| / max |p| after K plain-SGD steps, TF32 off); FSDP bf16/fp16 within 5e-2 of DDP fp32.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from helpers.gpu import trainscale
from helpers.multiproc import run_on_ranks

needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")


def train_all(device: str, specs: list[str], backend: str | None = None) -> dict:
    import trainscale as ts
    from trainscale.selftest.checks import STEPS, _full_params, batch, exact_fp32, mlp
    from trainscale.strategies import get_strategy
    from trainscale.strategies.base import OptimizerSpec

    out = {}
    with ts.init(device=device, backend=backend, timeout_s=300) as rt, exact_fp32():
        for spec in specs:
            options = {"micro_batch_size": 32 // rt.world_size} if spec.startswith("deepspeed") else {}
            strategy = get_strategy(spec, **options)
            model, opt = strategy.wrap(mlp(), OptimizerSpec(torch.optim.SGD, {"lr": 0.05}), rt)
            for i in range(STEPS):
                x, y = batch(i, rt)
                strategy.backward_loss(torch.nn.functional.cross_entropy(model(x).float(), y), model)
                if getattr(strategy, "cpu_offload", False):
                    # clipping reduces the host-side shards: needs gloo beside nccl (trainscale's mixed group)
                    if strategy.scaler is not None:
                        strategy.scaler.unscale_(opt)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                strategy.micro_step(opt, model, last=True)
            out[spec] = {
                "params": _full_params(strategy, model, opt),
                "device": str(next(strategy.unwrap(model).parameters()).device),
                "backend": rt.backend,
            }
    return out


def _max_rel(a, b) -> float:
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)) for k in b)


def test_zero1_fsdp_and_mixed_precision_match_ddp(gpus):
    gpus.need(2)
    specs = [
        "ddp",
        "zero1",
        "fsdp",
        "fsdp:reshard_after_forward=false",
        "fsdp:mixed_precision=bf16",
        "fsdp:mixed_precision=fp16",
    ]
    r = run_on_ranks(train_all, 2, gpus.device, specs, timeout=600)[0]
    ddp = r["ddp"]["params"]
    assert all(torch.equal(ddp[k], r["zero1"]["params"][k]) for k in ddp)
    assert _max_rel(r["fsdp"]["params"], ddp) <= 1e-5
    assert _max_rel(r["fsdp:reshard_after_forward=false"]["params"], ddp) <= 1e-5
    for low in ("fsdp:mixed_precision=bf16", "fsdp:mixed_precision=fp16"):
        assert 0 < _max_rel(r[low]["params"], ddp) <= 5e-2, low
    if not gpus.on_cpu:
        assert r["ddp"]["device"] == "cuda:0" and r["ddp"]["backend"] == "nccl"


@pytest.mark.needs_cuda
def test_fsdp_cpu_offload_on_gpus_clips_over_the_mixed_group(gpus):
    """Defect 2's path: host-side shards need gloo beside nccl (trainscale.init(backend=MIXED))."""
    gpus.need(2)
    from trainscale.runtime.device import MIXED_BACKEND

    r = run_on_ranks(train_all, 2, "cuda", ["ddp", "fsdp:cpu_offload=true"], MIXED_BACKEND, timeout=600)[0]
    assert r["fsdp:cpu_offload=true"]["backend"] == MIXED_BACKEND
    assert all(torch.isfinite(v).all() for v in r["fsdp:cpu_offload=true"]["params"].values())


@pytest.mark.needs_cuda
def test_fsdp_cpu_offload_alone_on_one_gpu(gpus):
    """issue 39 defect 7: one rank, no process group of the runtime's: FSDP shards over a group of its own
    with gloo beside nccl, with and without mixed precision, and its parameters live on the host."""
    gpus.need(1)
    specs = ["fsdp:cpu_offload=true", "fsdp:mixed_precision=bf16,cpu_offload=true"]
    r = run_on_ranks(train_all, 1, "cuda", specs, timeout=600)[0]
    for spec in specs:
        assert all(torch.isfinite(v).all() for v in r[spec]["params"].values()), spec
        assert r[spec]["device"] == "cpu", r[spec]  # the offloaded shards


@needs_deepspeed
def test_deepspeed_matches_ddp_on_gpus(gpus):
    gpus.need(2)
    r = run_on_ranks(train_all, 2, gpus.device, ["ddp", "deepspeed:stage=2", "deepspeed:stage=3"], timeout=900)[0]
    for spec in ("deepspeed:stage=2", "deepspeed:stage=3"):
        assert _max_rel(r[spec]["params"], r["ddp"]["params"]) <= 1e-5, spec


@needs_deepspeed
@pytest.mark.needs_cuda
def test_deepspeed_with_one_visible_gpu_per_rank(gpus):
    """Defect 1: rank 1 sees only its own GPU (cuda:0) while its local rank is 1; DeepSpeed takes
    LOCAL_RANK as the GPU index and would ask for an invalid ordinal without trainscale's fix."""
    gpus.need(2)
    r = run_on_ranks(
        train_all,
        2,
        "cuda",
        ["ddp", "deepspeed:stage=1"],
        rank_env={0: {"CUDA_VISIBLE_DEVICES": "0"}, 1: {"CUDA_VISIBLE_DEVICES": "1"}},
        timeout=900,
    )
    assert all(res["deepspeed:stage=1"]["device"] == "cuda:0" for res in r.values())
    assert _max_rel(r[0]["deepspeed:stage=1"]["params"], r[0]["ddp"]["params"]) <= 1e-5


@needs_deepspeed
@pytest.mark.needs_cuda
def test_deepspeed_with_device_cpu_on_a_gpu_node_stays_on_the_cpu(gpus):
    """Defect 9: --device cpu must keep DeepSpeed's accelerator (and the model) on the CPU."""
    r = run_on_ranks(train_all, 2, "cpu", ["deepspeed:stage=1"], timeout=900)
    assert r[0]["deepspeed:stage=1"]["device"] == "cpu"


@pytest.mark.needs_cuda
def test_hf_finetune_with_fsdp_cpu_offload_on_gpus(gpus, tmp_path):
    """The HF Trainer with FSDP2 + CPU offload: its gradient clipping over host shards needs the mixed group."""
    gpus.need(2)
    pytest.importorskip("transformers")
    done = trainscale(
        tmp_path,
        "run",
        "--nproc-per-node",
        "2",
        "--log-dir",
        "logs",
        "--workload",
        "hf-finetune",
        "--strategy",
        "fsdp:cpu_offload=true",
        "--max-steps",
        "3",
        "--global-batch",
        "8",
        "--output-dir",
        "out",
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert "backend cpu:gloo,cuda:nccl" in done.stdout
