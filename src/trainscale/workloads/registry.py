"""The built-in workloads: name -> module with a ``main(argv)``."""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass

from trainscale.errors import ConfigError, did_you_mean


@dataclass(frozen=True)
class Workload:
    name: str
    module: str
    description: str
    seed: str
    global_batch: bool = False
    """Its batch is given for all ranks together (``--global-batch``), not per rank (``--batch-size``)."""

    def batch_args(self, per_rank: int | None, ranks: int) -> list[str]:
        """The options that give this workload ``per_rank`` samples per rank on ``ranks`` ranks."""
        if not per_rank:
            return []
        return ["--global-batch", str(per_rank * ranks)] if self.global_batch else ["--batch-size", str(per_rank)]


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("cnn", "trainscale.workloads.cnn", "seed 004's CNN classifier on MNIST-shaped digits", "004"),
        Workload("vit", "trainscale.workloads.vit", "a small Vision Transformer classifier", "002"),
        Workload("gpt", "trainscale.workloads.gpt", "a GPT-2-style causal LM with a custom training loop", "003"),
        Workload(
            "hf-finetune",
            "trainscale.workloads.hf_finetune",
            "GPT-Neo-style fine-tune with the HF Trainer",
            "000/001",
            global_batch=True,
        ),
    )
}


def available() -> dict[str, Workload]:
    """Workloads whose module exists in this installation."""
    return {name: w for name, w in WORKLOADS.items() if importlib.util.find_spec(w.module) is not None}


def get_workload(name: str) -> Workload:
    found = available()
    if name not in found:
        raise ConfigError(f"unknown workload {name!r}", hint=did_you_mean(name, list(found)))
    return found[name]


def workload_preflight(name: str):
    """The workload's own check of its arguments before anything launches, ``preflight(args, world_size, ...)``,
    or None when it has none."""
    return getattr(importlib.import_module(get_workload(name).module), "preflight", None)


def job_preflight(spec):
    """What lint runs over a SLURM job's arguments: the workload's preflight, or for a script its own
    --deepspeed_config read as DeepSpeed reads it; None for a module."""
    if spec.workload:
        return workload_preflight(spec.workload)
    if not spec.script:
        return None
    from trainscale.launch.preflight import check_script_args  # noqa: PLC0415 (CLI start-up)

    def preflight(args, world_size, *, gpus):
        check_script_args(args, world_size, device="cuda" if gpus else "cpu")

    return preflight


def launch_preflight(
    workload: str | None, args: list[str], *, nproc_per_node: int, nnodes: str, python: bool = True
) -> None:
    """Before a local launch: the workload's preflight when the world size is fixed (``--nnodes MIN:MAX`` leaves
    it open), else a Python script's own --deepspeed_config."""
    from trainscale.launch.local import parse_nnodes  # noqa: PLC0415 (CLI start-up)

    low, high = parse_nnodes(nnodes)
    if workload:
        check = workload_preflight(workload) if low == high else None
        if check:
            check(args, nproc_per_node * low)
    elif python:
        from trainscale.launch.preflight import check_script_args  # noqa: PLC0415 (CLI start-up)

        check_script_args(args, nproc_per_node * low)


def table() -> list[str]:
    """The built-in workloads as ``trainscale run --help`` lists them."""
    present = available()
    lines = [f"  {'NAME':<13} {'SEED':<8} DESCRIPTION"]
    for name, w in WORKLOADS.items():
        lines.append(
            f"  {name:<13} {w.seed:<8} {w.description}{'' if name in present else '  (not in this installation)'}"
        )
    return lines + [
        "  Each takes --epochs, --max-steps, --batch-size (per rank), --lr, --strategy, --seed; "
        "trainscale run --workload NAME --help lists all."
    ]
