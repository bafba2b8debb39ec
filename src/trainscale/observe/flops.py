"""Model FLOPs utilisation: the FLOPs one training step does (counted once with torch's FlopCounterMode),
over the time the step took, over what the device can do at most (a table of peaks by device and
dtype; on a CPU a short matrix-multiply probe measures it).

MFU = flops_per_step / step_time / (peak per device x devices), as torchtitan and Lightning's
ThroughputMonitor report it: dense peaks (no sparsity), the step's own dtype.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

# Dense peak FLOP/s per device (one GPU; one GCD for the MI250X), by dtype, from the vendors' data
# sheets (which print the sparse figures: dense is half). fp32 = plain FP32 (no TF32). Hopper's SXM
# parts (H100 SXM5, H200 SXM, GH200's GPU) share their compute; the PCIe and NVL cards run lower clocks.
PEAKS: dict[str, dict[str, float]] = {
    "H100 SXM": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
    "H100 PCIe": {"bf16": 756.5e12, "fp16": 756.5e12, "tf32": 378e12, "fp32": 51.2e12},
    "H100 NVL": {"bf16": 835.5e12, "fp16": 835.5e12, "tf32": 417.5e12, "fp32": 60e12},
    "H200 SXM": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
    "H200 NVL": {"bf16": 835.5e12, "fp16": 835.5e12, "tf32": 417.5e12, "fp32": 60e12},
    "GH200": {"bf16": 989.4e12, "fp16": 989.4e12, "tf32": 494.7e12, "fp32": 66.9e12},
    "A100": {"bf16": 312e12, "fp16": 312e12, "tf32": 156e12, "fp32": 19.5e12},
    "MI250X": {"bf16": 191.5e12, "fp16": 191.5e12, "fp32": 47.9e12},
    "MI300X": {"bf16": 1307e12, "fp16": 1307e12, "tf32": 653.7e12, "fp32": 163.4e12},
}
NAMES = (
    ("GH200", "GH200"),
    ("H200NVL", "H200 NVL"),
    ("H200", "H200 SXM"),
    ("H100NVL", "H100 NVL"),
    ("H100PCIE", "H100 PCIe"),
    ("H100", "H100 SXM"),
    ("A100", "A100"),
    ("MI250X", "MI250X"),
    ("MI300X", "MI300X"),
)
"""What ``torch.cuda.get_device_name`` says (upper case, no spaces) -> the PEAKS row, most specific first:
``NVIDIA GH200 480GB`` is no H200, ``NVIDIA H100 PCIe`` no H100 SXM."""
DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


@dataclass(frozen=True)
class Peak:
    flops: float
    """FLOP/s one device can do at most in the step's dtype."""
    source: str
    """Where the number comes from: the table row, or the measured CPU probe."""


def device_key(name: str) -> str | None:
    """``NVIDIA H100 80GB HBM3`` -> ``H100 SXM``; ``AMD Instinct MI250X`` -> ``MI250X`` (None when unknown)."""
    upper = name.upper().replace(" ", "").replace("-", "")
    return next((key for part, key in NAMES if part in upper), None)


def cpu_probe(dtype: torch.dtype = torch.float32, size: int = 512, seconds: float = 0.3, windows: int = 6) -> float:
    """FLOP/s this process's threads reach on a square matmul (what 'peak' means on a CPU).

    The best of ``windows`` short windows, not their mean: anything else running on these cores
    (another rank finishing its epoch, the sampler, a neighbour) only ever lowers a window's rate,
    and a peak read low would put the MFU above 1.
    """
    a = torch.randn(size, size, dtype=dtype)
    b = torch.randn(size, size, dtype=dtype)
    torch.mm(a, b)  # warm-up: thread pool, caches
    best, window_s = 0.0, seconds / windows
    for _ in range(windows):
        n, started = 0, time.perf_counter()
        while True:
            torch.mm(a, b)
            n += 1
            elapsed = time.perf_counter() - started
            if elapsed >= window_s:
                break
        best = max(best, 2.0 * size**3 * n / elapsed)
    return best


def tf32_in_use() -> tuple[bool, bool]:
    """Whether fp32 matmuls and fp32 convolutions run in TF32 now: torch's ``fp32_precision`` settings where
    this torch has them ("none" inherits: cuda.matmul from the global one, cudnn.conv from cudnn's, then the
    global one), else the older ``allow_tf32`` flags. cuDNN's convolutions default to TF32, matmuls do not.
    (Reading ``allow_tf32`` after the new settings were used raises in torch >= 2.9: they come first.)"""
    backends = torch.backends
    if hasattr(backends, "fp32_precision") and hasattr(backends.cudnn, "conv"):

        def resolved(*chain: object) -> bool:
            said = [getattr(level, "fp32_precision", "none") for level in chain]
            return next((p for p in said if p != "none"), "ieee") == "tf32"

        return resolved(backends.cuda.matmul, backends), resolved(backends.cudnn.conv, backends.cudnn, backends)
    return bool(backends.cuda.matmul.allow_tf32), bool(backends.cudnn.allow_tf32)


def peak_for(device: torch.device, dtype: torch.dtype, conv_share: float = 0.0) -> Peak | None:
    """The peak for ``device`` (the CPU measured; a GPU from the table; None for an unknown GPU). In fp32 a
    GPU's matmuls and convolutions each run at the TF32 or the fp32 peak (:func:`tf32_in_use`); where they
    differ, the step's peak is the rate at which it would do its FLOPs, ``conv_share`` of them convolutions,
    each kind at its own peak."""
    if device.type == "cpu":
        return Peak(
            cpu_probe(dtype if dtype in (torch.float32, torch.float64) else torch.float32),
            f"measured: {torch.get_num_threads()} thread(s), matmul probe",
        )
    key = device_key(torch.cuda.get_device_name(device))
    if key is None:
        return None
    row, kind = PEAKS[key], DTYPES.get(dtype, "fp32")
    if kind != "fp32":
        return Peak(row.get(kind) or row["fp32"], f"{key} {kind} dense peak (data sheet)")
    matmul, conv = ("tf32" if on and "tf32" in row else "fp32" for on in tf32_in_use())
    if matmul == conv or conv_share <= 0 or conv_share >= 1:
        kind = conv if conv_share >= 1 else matmul
        return Peak(row[kind], f"{key} {kind} dense peak (data sheet)")
    value = 1.0 / (conv_share / row[conv] + (1 - conv_share) / row[matmul])
    return Peak(
        value,
        f"{key} dense peaks (data sheet): convolutions ({conv_share:.0%} of the FLOPs) at {conv}, matmuls at {matmul}",
    )


class Flops(int):
    """A step's FLOPs, and how many of them were convolutions (their peak may differ: :func:`peak_for`)."""

    conv: int = 0

    def __new__(cls, total: int, conv: int = 0) -> Flops:
        made = super().__new__(cls, total)
        made.conv = conv
        return made

    def times(self, n: int) -> Flops:
        return Flops(int(self) * n, self.conv * n)

    @property
    def conv_share(self) -> float:
        return self.conv / int(self) if int(self) else 0.0


CONV_OPS = ("convolution", "_convolution", "convolution_backward", "cudnn_convolution")


def count_step_flops(step: Callable[[], object]) -> Flops:
    """FLOPs of one call of ``step`` (forward and backward of one batch), counted by torch itself."""
    from torch.utils.flop_counter import FlopCounterMode  # noqa: PLC0415 (job kit)

    with FlopCounterMode(display=False) as counter:
        step()
    by_op = counter.get_flop_counts().get("Global", {})
    conv = sum(n for op, n in by_op.items() if str(op).removeprefix("aten.").split(".")[0] in CONV_OPS)
    return Flops(int(counter.get_total_flops()), int(conv))


def mfu(flops_per_step: float, step_s: float, peak: float, devices: int = 1) -> float | None:
    """The fraction of the devices' peak the model's own FLOPs used; None without a time or a peak."""
    if not step_s or step_s <= 0 or not peak or devices < 1:
        return None
    return flops_per_step / step_s / (peak * devices)


def plain_parameters(module: torch.nn.Module) -> bool:
    """Parameters held whole by this rank (ddp, zero1, no wrapper): not sharded by FSDP or DeepSpeed stage 3."""
    return all(type(p.data) is torch.Tensor and p.numel() > 0 and not hasattr(p, "ds_id") for p in module.parameters())


def plain_step_flops(
    module: torch.nn.Module, forward: Callable[[torch.nn.Module], object], micro_batches: int = 1
) -> Flops | None:
    """FLOPs of one optimizer step of a module with plain parameters: ``forward(module)`` once without
    gradients (random state and buffers restored after), backward counted as twice the forward — what
    FlopCounterMode counts for matmuls and convolutions. None for a sharded module."""
    if not plain_parameters(module):
        return None
    buffers = {name: b.detach().clone() for name, b in module.named_buffers()}
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    devices = [device] if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        counted = count_step_flops(lambda: forward(module))
    with torch.no_grad():
        for name, b in module.named_buffers():
            b.copy_(buffers[name])
    return counted.times(3 * micro_batches)
