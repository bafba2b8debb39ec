"""What one GPU can prove (each a step of scripts/gpu-check.sh's summary): ddp, zero1 and fsdp through a real
one-rank NCCL group, bf16 mixed precision, a background checkpoint save and its resume, and the recorder's device
and MFU on a model fed through torchvision-style transforms. In the suite's CPU mode the same runs go over gloo on
the CPU, shrunk (they then check the test code and the script, nothing about GPUs)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from helpers.gpu import trainscale

STEPS = {
    "ddp": "ddp:replicate_alone=true",
    "zero1": "zero1:replicate_alone=true",
    "fsdp": "fsdp:shard_alone=true",
    "fsdp-bf16": "fsdp:shard_alone=true,mixed_precision=bf16",
    "deepspeed": "deepspeed",
}
"""The strategies on one rank, each through a process group of its own (unwrapped otherwise)."""


def records(log_dir: Path) -> list[dict]:
    (path,) = (log_dir / "latest" / "metrics").glob("rank-0.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def cnn_run(gpus, tmp_path: Path, *extra: str, steps: int | None = None) -> tuple:
    device = gpus.device
    samples = 2048 if not gpus.on_cpu else 256
    done = trainscale(
        tmp_path,
        "run",
        "--nproc-per-node",
        "1",
        "--log-dir",
        "logs",
        "--workload",
        "cnn",
        "--device",
        device,
        "--data",
        "synthetic",
        "--batch-size",
        "16",
        "--epochs",
        "1",
        "--samples",
        str(samples),
        "--max-steps",
        str(steps or (2 if gpus.on_cpu else 20)),
        *extra,
        timeout=300,
    )
    return done, records(tmp_path / "logs") if done.returncode == 0 else []


@pytest.mark.parametrize("name", list(STEPS))
def test_one_rank_trains_through_a_real_process_group(gpus, tmp_path, name):
    if name == "deepspeed" and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed")
    done, recorded = cnn_run(gpus, tmp_path, "--strategy", STEPS[name])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    meta = next(r for r in recorded if r["kind"] == "meta")
    summary = next(r for r in recorded if r["kind"] == "summary")
    assert meta["strategy"] == name.split("-")[0], meta  # wrapped (DDP, FSDP, DeepSpeed's engine), not bare
    assert meta["backend"] == ("gloo" if gpus.on_cpu else "nccl") or (
        name.startswith("deepspeed") and "nccl" in str(meta["backend"])
    ), meta
    assert meta["device"] == ("cpu" if gpus.on_cpu else "cuda:0")
    if name == "fsdp-bf16":
        assert summary["flops_dtype"] == "torch.bfloat16", summary  # computed in bf16: rated against bf16's peak


def test_a_background_checkpoint_save_resumes(gpus, tmp_path):
    first, _ = cnn_run(
        gpus,
        tmp_path,
        "--strategy",
        STEPS["fsdp"],
        "--checkpoint-dir",
        "ck",
        "--checkpoint-every",
        "2",
        "--checkpoint-async",
        steps=4,
    )
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    saved = sorted(p.name for p in (tmp_path / "ck").iterdir() if p.name.startswith("ckpt-"))
    assert saved, list((tmp_path / "ck").iterdir())
    again, recorded = cnn_run(
        gpus, tmp_path, "--strategy", STEPS["fsdp"], "--checkpoint-dir", "ck", "--checkpoint-async", steps=6
    )
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert f"Resumed from ck/{saved[-1]} at step 4" in again.stdout, again.stdout[-2000:]


SCRIPT = """
import torch
from torch import nn
import trainscale

class Normalize(nn.Module):  # torchvision's transforms are nn.Modules without parameters
    def forward(self, x):
        return (x - 0.5) / 0.25

class Images(torch.utils.data.Dataset):
    def __init__(self):
        self.transform, self.x = Normalize(), torch.rand(512, 3, 32, 32)
    def __len__(self):
        return len(self.x)
    def __getitem__(self, i):
        return self.transform(self.x[i]), i % 10

with trainscale.init() as rt:
    net = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))
    model, opt = rt.setup(net, lambda p: torch.optim.SGD(p, lr=0.01))
    for step, (x, y) in enumerate(torch.utils.data.DataLoader(Images(), batch_size=32, num_workers=0)):
        nn.functional.cross_entropy(model(x.to(rt.device)), y.to(rt.device)).backward()
        opt.step()
        opt.zero_grad()
        if step == STEPS:
            break
"""


def test_the_recorder_times_the_gpu_and_rates_the_model_not_its_transforms(gpus, tmp_path):
    """issue 47 N4: the transforms a num_workers=0 loader calls came first and led the recorder: host timestamps,
    RSS as peak memory, one sample per step, Normalize's FLOPs."""
    (tmp_path / "train.py").write_text(SCRIPT.replace("STEPS", "3" if gpus.on_cpu else "12"))
    done = trainscale(
        tmp_path,
        "run",
        "--nproc-per-node",
        "1",
        "--log-dir",
        "logs",
        "train.py",
        *(["--device", "cpu"] if gpus.on_cpu else []),
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    recorded = records(tmp_path / "logs")
    meta = next(r for r in recorded if r["kind"] == "meta")
    summary = next(r for r in recorded if r["kind"] == "summary")
    steps = [r for r in recorded if r["kind"] == "step"]
    assert meta["device"] == ("cpu" if gpus.on_cpu else "cuda:0"), meta
    assert {r["samples"] for r in steps} == {32}, steps
    conv = 2 * 32 * 32 * 32 * (3 * 9 * 64 + 64 * 9 * 64)  # the convolutions' multiply-adds of one batch
    assert conv * 2 < summary["flops_per_step"] < conv * 4, summary  # forward + backward, not Normalize's
    assert summary["mfu"] is not None and 0 < summary["mfu"] < 1, summary
    if not gpus.on_cpu:
        assert "tf32" in summary["peak_source"], summary  # cuDNN's convolutions run in TF32 by default (N11)
        assert summary["reserved_peak_bytes"] >= summary["peak_mem_bytes"] > 0, summary  # CUDA's, not RSS
