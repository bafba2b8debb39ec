"""trainscale's ``--strategy`` for a Hugging Face ``Trainer``: the Trainer runs the strategy itself
(through accelerate), so the choice becomes ``TrainingArguments`` entries instead of a wrapped model.

Pure: it builds and checks the arguments, so ``trainscale run`` can refuse a bad choice before launch.
Here, inside strategies/, because which arguments express a strategy depends on which strategy it is.
"""

from __future__ import annotations

from typing import Any

from trainscale.errors import ConfigError
from trainscale.strategies import get_strategy
from trainscale.strategies.deepspeed import prepare_environment as prepare_deepspeed
from trainscale.strategies.ds_config import load_ds_config


def trainer_arguments(
    spec: str, *, world_size: int, per_device: int, use_cpu: bool, accumulation: int = 1
) -> dict[str, Any]:
    """``TrainingArguments`` keywords that make the Trainer run ``spec`` (``ddp``, ``fsdp[:...]``,
    ``deepspeed[:...]``) with ``accumulation`` micro-batches per step; ``zero1``, and FSDP on the CPU,
    are refused with the alternative."""
    strategy = get_strategy(spec)  # unknown names and options fail here, with the valid ones listed
    accumulate = {"gradient_accumulation_steps": accumulation} if accumulation > 1 else {}
    if strategy.name == "ddp":
        unmapped = [
            f"{name}={value}".lower()
            for name, value, honoured in (
                ("static_graph", strategy.static_graph, ("auto", False)),
                ("gradient_as_bucket_view", strategy.gradient_as_bucket_view, (True,)),
                ("comm_hook", strategy.comm_hook, ("none", "auto")),
            )
            if value not in honoured
        ]
        if unmapped:
            # TrainingArguments has no entry for these; accepting them would change nothing.
            raise ConfigError(
                f"--strategy ddp:{','.join(unmapped)} has no HF Trainer argument; the Trainer would train without it",
                hint="with hf-finetune, ddp takes bucket_cap_mb and find_unused_parameters",
            )
        # auto: the Trainer leaves the size to torch (a 1 MiB first bucket, then 25 MiB)
        cap = None if strategy.bucket_cap_mb == "auto" else max(1, round(strategy.bucket_cap_mb))
        return {"ddp_find_unused_parameters": strategy.find_unused_parameters, "ddp_bucket_cap_mb": cap, **accumulate}
    if strategy.name == "zero1":
        raise ConfigError(
            "--strategy zero1 (torch's ZeroRedundancyOptimizer) has no HF Trainer integration",
            hint="the Trainer shards optimizer state through DeepSpeed: --strategy deepspeed:stage=1",
        )
    if strategy.name == "fsdp":
        if use_cpu:
            # accelerate enables FSDP only for accelerator devices; on CPU the Trainer would quietly use DDP.
            raise ConfigError(
                "--strategy fsdp with the HF Trainer needs GPUs: on the CPU accelerate "
                "ignores FSDP and trains with plain DDP",
                hint="on the CPU use --strategy deepspeed:stage=3 (sharded) or ddp",
            )
        args: dict[str, Any] = {
            **accumulate,
            "fsdp": True,
            "fsdp_config": {
                "version": 2,
                "reshard_after_forward": strategy.reshard_after_forward,
                "cpu_offload": strategy.cpu_offload,
                "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                "transformer_layer_cls_to_wrap": list(strategy.unit_modules) or ["GPTNeoBlock"],
            },
        }
        if strategy.mixed_precision != "none":
            args[strategy.mixed_precision] = True  # bf16=True / fp16=True
        return args
    if strategy.name == "deepspeed":
        user = load_ds_config(strategy.config) if isinstance(strategy.config, str) else strategy.config
        given = user.get("train_micro_batch_size_per_gpu") if isinstance(user, dict) else None
        if given not in (None, "auto", per_device):
            raise ConfigError(
                f"ds_config train_micro_batch_size_per_gpu={given}, but --global-batch ÷ world size "
                f"gives a per-device batch of {per_device}",
                hint='set it to "auto" (the Trainer fills it in) or change --global-batch',
            )
        strategy = strategy.with_batch(per_device, accumulation if accumulation > 1 else None)
        config = strategy.ds_config(world_size, "cpu" if use_cpu else "cuda")
        if strategy.config is None and "gradient_clipping" not in strategy.overrides:
            # the Trainer clips by its max_grad_norm under every strategy: so here too
            config["gradient_clipping"] = "auto"
        # The Trainer checks that its own arguments agree with the ds_config; make them agree.
        return {
            "deepspeed": config,
            "gradient_accumulation_steps": config["gradient_accumulation_steps"],
            "bf16": bool(config.get("bf16", {}).get("enabled")),
            "fp16": bool(config.get("fp16", {}).get("enabled")),
        }
    raise ConfigError(f"strategy {strategy.name!r} has no HF Trainer mapping", hint="use ddp, fsdp or deepspeed")


def prepare_environment(strategy_args: dict[str, Any], runtime: Any) -> list[str]:
    """What the Trainer's strategy needs set before ``TrainingArguments`` is built (it imports DeepSpeed):
    DeepSpeed's accelerator, LOCAL_RANK as the GPU index and trainscale's cache of its compiled ops
    (shared with the deepspeed strategy). Returns a note per variable set."""
    if "deepspeed" not in strategy_args:
        return []

    return prepare_deepspeed(runtime)
