"""DeepSpeed ZeRO (stages 1-3) through ``deepspeed.initialize``: the user's own ``ds_config.json``, or
one built from trainscale's options. An optional extra: ``pip install 'trainscale[deepspeed]'``.

First start: DeepSpeed compiles a shared-memory communication op for CPU runs (and fused optimizers
when a config asks for DeepSpeed's own Adam). The build is cached in ``TORCH_EXTENSIONS_DIR``, which
trainscale points at ``~/.cache/trainscale/torch_extensions`` unless it is set: the first run pays
about a minute, later ones a few seconds.

Gradient accumulation is DeepSpeed's own: set ``gradient_accumulation_steps`` and call
``strategy.backward`` and ``strategy.step`` after every micro-batch; DeepSpeed scales the loss, skips
the reduction and the optimizer step until the last micro-batch. ``no_sync`` is therefore a no-op.

Checkpoints are DeepSpeed's native sharded files inside trainscale's sharded checkpoint directory
(same temp-dir, marker-last protocol), resumed with the same world size.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainscale.errors import CheckpointError, ConfigError
from trainscale.runtime.memory import tensor_bytes
from trainscale.strategies.base import OptimizerFactory, as_optimizer_spec
from trainscale.strategies.ds_config import PRECISIONS, STAGES, build_ds_config, load_ds_config, validate_ds_config

CHECKPOINT_TAG = "deepspeed"


def extensions_dir(environ: dict[str, str] | None = None) -> str:
    """Where compiled DeepSpeed ops are cached: $TORCH_EXTENSIONS_DIR, else ~/.cache/trainscale/torch_extensions."""
    environ = os.environ if environ is None else environ
    return environ.get("TORCH_EXTENSIONS_DIR") or str(Path.home() / ".cache" / "trainscale" / "torch_extensions")


@dataclass(kw_only=True)
class DeepSpeedStrategy:
    """``deepspeed.initialize`` over the user's model and optimizer, configured by a ds_config."""

    config: str | dict | None = None
    """Path of the user's ds_config.json (or the dict itself); None builds one from the options below."""
    stage: int = 3
    """ZeRO stage for a built config: 1 optimizer state, 2 + gradients, 3 + parameters sharded."""
    precision: str = "fp32"
    """fp32, bf16 or fp16 (GPU only) for a built config; floating inputs are cast to match."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step (DeepSpeed's own accumulation)."""
    micro_batch_size: int | None = None
    """Per-rank batch size (train_micro_batch_size_per_gpu); workloads fill in --batch-size."""
    overrides: dict = field(default_factory=dict)
    """Extra top-level ds_config entries merged into a built config (e.g. zero_optimization details)."""

    name: str = "deepspeed"
    sharded_checkpoint: bool = True

    def __post_init__(self) -> None:
        if importlib.util.find_spec("deepspeed") is None:
            raise ConfigError("strategy 'deepspeed' needs the package 'deepspeed', which is not installed",
                              hint="pip install 'trainscale[deepspeed]', or use --strategy fsdp / zero1")
        if self.stage not in STAGES:
            raise ConfigError(f"deepspeed stage={self.stage!r} is not a ZeRO stage", hint="use 0, 1, 2 or 3")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"deepspeed precision={self.precision!r} unknown", hint=f"use one of {', '.join(PRECISIONS)}")
        if self.gradient_accumulation_steps < 1:
            raise ConfigError(f"gradient_accumulation_steps={self.gradient_accumulation_steps} must be >= 1",
                              hint="1 means no accumulation")
        self._grad_bytes = 0

    # -- configuration ---------------------------------------------------------------------------
    def ds_config(self, world_size: int, device: str | None = None) -> dict[str, Any]:
        """The validated config this strategy will hand to DeepSpeed (usable in a preflight)."""
        if self.config is None:
            config = build_ds_config(micro_batch_size=self.micro_batch_size or 1, stage=self.stage,
                                     precision=self.precision,
                                     gradient_accumulation_steps=self.gradient_accumulation_steps)
            config.update(self.overrides)
        else:
            config = dict(self.config) if isinstance(self.config, dict) else load_ds_config(self.config)
            given = config.get("train_micro_batch_size_per_gpu")
            if self.micro_batch_size is not None and given not in (None, "auto", self.micro_batch_size):
                raise ConfigError(f"ds_config train_micro_batch_size_per_gpu={given}, but the per-rank batch size "
                                  f"is {self.micro_batch_size} (--batch-size)",
                                  hint=f"make them equal: --batch-size {given}, or remove the key from the ds_config")
            if given in (None, "auto") and self.micro_batch_size is not None:
                config["train_micro_batch_size_per_gpu"] = self.micro_batch_size
            config.setdefault("zero_allow_untested_optimizer", True)
        return validate_ds_config(config, world_size, device=device)

    def preflight(self, world_size: int, device: str | None = None) -> None:
        self.ds_config(world_size, device)

    # -- the protocol ----------------------------------------------------------------------------
    def setup(self, model: nn.Module, make_optimizer: OptimizerFactory, runtime: Any) -> tuple[nn.Module, Any]:
        config = self.ds_config(runtime.world_size, runtime.device.type)
        if "TORCH_EXTENSIONS_DIR" not in os.environ:
            os.environ["TORCH_EXTENSIONS_DIR"] = extensions_dir()
            runtime.print(f"trainscale: TORCH_EXTENSIONS_DIR={os.environ['TORCH_EXTENSIONS_DIR']} "
                          "(DeepSpeed's compiled ops are cached there; the first start builds them)")
        _ensure_process_group(runtime)
        import deepspeed

        model = model.to(runtime.device)
        client_optimizer = None if "optimizer" in config else as_optimizer_spec(make_optimizer)(model.parameters())
        engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=client_optimizer, config=config)
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(_precision_of(config))
        if dtype is not None:
            engine.module.register_forward_pre_hook(_cast_inputs(dtype))
        return engine, optimizer

    def backward(self, loss: torch.Tensor, model: Any) -> None:
        model.backward(loss)

    def step(self, optimizer: Any, model: Any) -> None:
        if not self._grad_bytes and model.is_gradient_accumulation_boundary():
            self._grad_bytes = tensor_bytes(_gradient_tensors(model))
        model.step()  # steps the optimizer on accumulation boundaries and zeroes the gradients

    def no_sync(self, model: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # DeepSpeed skips the reduction itself (gradient_accumulation_steps)

    def unwrap(self, model: Any) -> nn.Module:
        return getattr(model, "module", model)

    def state_dict(self, model: Any, optimizer: Any) -> dict[str, Any]:
        def write(path: Path) -> None:
            model.save_checkpoint(str(path), tag=CHECKPOINT_TAG, save_latest=False)

        return {"sharded_writer": write}

    def load_state_dict(self, model: Any, optimizer: Any, state: dict[str, Any]) -> None:
        ref = state.get("sharded")
        if ref is None or ref.format != "deepspeed":
            raise CheckpointError("this checkpoint was not written by the deepspeed strategy",
                                  hint="resume with the strategy that wrote it, or start a new checkpoint directory")
        saved = int(state["trainscale"]["world_size"])
        world = model.dp_world_size if hasattr(model, "dp_world_size") else saved
        if saved != world:
            raise CheckpointError(f"{ref.path} holds DeepSpeed ZeRO shards for {saved} rank(s); this run has {world}",
                                  hint=f"resume with {saved} ranks, or convert it with DeepSpeed's ds_to_universal.py "
                                       "and load it yourself; fsdp checkpoints reshard to any world size")
        load_path, _ = model.load_checkpoint(str(ref.path), tag=CHECKPOINT_TAG, load_optimizer_states=True,
                                             load_lr_scheduler_states=False)
        if load_path is None:
            raise CheckpointError(f"DeepSpeed found no checkpoint under {ref.path}", hint="delete the directory")

    def held_bytes(self, model: Any, optimizer: Any) -> dict[str, int]:
        """At rest. Parameters: each one's ZeRO-3 partition (``ds_tensor``) plus the ones DeepSpeed keeps
        whole (below stage3_param_persistence_threshold, or stages 0-2); copies gathered for a forward
        are transient (they show in the peak). Optimizer: the torch optimizer's state plus DeepSpeed's
        fp32 master partition."""
        params = [p for p in model.module.parameters() if not hasattr(p, "ds_tensor") or getattr(p, "ds_persist", False)]
        params += [p.ds_tensor for p in model.module.parameters() if hasattr(p, "ds_tensor")]
        zero = model.optimizer
        masters = getattr(zero, "single_partition_of_fp32_groups", None) or getattr(zero, "fp32_partitioned_groups_flat", [])
        inner = getattr(zero, "optimizer", zero)
        state = [v for per in getattr(inner, "state", {}).values() for v in per.values() if torch.is_tensor(v)]
        return {"params": tensor_bytes(params),
                "grads": self._grad_bytes, "optimizer": tensor_bytes(list(masters) + state)}


def _gradient_tensors(engine: Any) -> list[torch.Tensor]:
    """The gradient buffers DeepSpeed holds at the optimizer step (full, or this rank's partition)."""
    zero = engine.optimizer
    found = [p.grad for p in engine.module.parameters()]
    for attr in ("averaged_gradients", "grad_partitions_flat_buffer", "ipg_buffer"):
        found.extend(_tensors_in(getattr(zero, attr, None)))
    return found


def _tensors_in(value: Any) -> list[torch.Tensor]:
    if torch.is_tensor(value):
        return [value]
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors_in(v)]
    return []


def _precision_of(config: dict[str, Any]) -> str:
    if config.get("bf16", config.get("bfloat16", {})).get("enabled"):
        return "bf16"
    return "fp16" if config.get("fp16", {}).get("enabled") else "fp32"


def _cast_inputs(dtype: torch.dtype):
    def hook(module: nn.Module, args: tuple) -> tuple:
        return tuple(a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)

    return hook


def _ensure_process_group(runtime: Any) -> None:
    """DeepSpeed needs a process group even for one process; trainscale's Runtime makes none then.
    Create a one-rank group and hand it to the Runtime, whose close() is the one teardown path."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    backend = "nccl" if runtime.device.type == "cuda" else "gloo"
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    runtime.owns_process_group = True
