"""DeepSpeed ZeRO (stages 1-3) through ``deepspeed.initialize``: the user's own ``ds_config.json``, or
one built from trainscale's options. Optional: ``pip install deepspeed``.

First start: DeepSpeed compiles a shared-memory communication op for CPU runs (and fused optimizers
when a config asks for DeepSpeed's own Adam). The build is cached in ``TORCH_EXTENSIONS_DIR``, which
trainscale points at a directory of this environment's own under ``~/.cache/trainscale/torch_extensions``
unless it is set, and builds with this environment's ``ninja`` whatever PATH says: the first run pays
about a minute, later ones a few seconds.

Gradient accumulation is DeepSpeed's own: ``with_batch`` sets ``gradient_accumulation_steps`` from the
loop's, and ``micro_step`` steps the engine after every micro-batch; DeepSpeed scales the loss, skips
the reduction and the optimizer step until the last micro-batch. ``no_sync`` is therefore a no-op.

Checkpoints are DeepSpeed's native sharded files inside trainscale's sharded checkpoint directory
(same temp-dir, marker-last protocol), resumed with the same world size.

Which device DeepSpeed uses is decided by two things it reads itself (:func:`prepare_environment`
sets both, before DeepSpeed is imported and initialised): its *accelerator*, chosen at import
(a GPU whenever CUDA is available, so ``--device cpu`` on a GPU node needs ``DS_ACCELERATOR=cpu``),
and ``LOCAL_RANK``, which it asserts is set and takes as the *GPU index*. trainscale already chose
this rank's GPU; with one GPU per task that index is 0 whatever the local rank, so DeepSpeed gets
the index, not the local rank.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import os
import shutil
import sys
import time
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainscale.checkpoint.state import NATIVE, ModelState
from trainscale.errors import CheckpointError, ConfigError
from trainscale.runtime.memory import tensor_bytes
from trainscale.strategies.base import OptimizerSource, StrategyBase, one_rank_group, state_tensors
from trainscale.strategies.ds_config import PRECISIONS, STAGES, build_ds_config, load_ds_config, validate_ds_config
from trainscale.strategies.handout import through_strategy
from trainscale.strategies.optim import build_optimizer, parameter_names

CHECKPOINT_TAG = "deepspeed"


def extensions_dir(environ: dict[str, str] | None = None) -> str:
    """Where compiled DeepSpeed ops are cached: $TORCH_EXTENSIONS_DIR, else one directory per Python
    environment and torch under ~/.cache/trainscale/torch_extensions. An op's build names the headers of
    the torch it was built for: two environments sharing one directory (two venvs, a container and a
    venv, one home on every node) would rebuild it on every switch, or load one built for another torch."""
    environ = os.environ if environ is None else environ
    if environ.get("TORCH_EXTENSIONS_DIR"):
        return environ["TORCH_EXTENSIONS_DIR"]

    key = hashlib.sha256(f"{sys.prefix}\0{torch.__version__}".encode()).hexdigest()[:12]
    return str(
        Path.home()
        / ".cache"
        / "trainscale"
        / "torch_extensions"
        / f"py{sys.version_info[0]}{sys.version_info[1]}-{key}"
    )


CPU_OP = "deepspeed_shm_comm"
"""The op DeepSpeed compiles for CPU ranks (its shared-memory collectives), on its first start per environment."""


def op_to_build(directory: str | Path, device_type: str) -> str | None:
    """The op this start will compile (a minute on 2 cores, silent otherwise), or None when it is cached."""
    if device_type != "cpu":
        return None  # GPU builds happen only for ops a config asks for (DeepSpeed's own Adam), and DeepSpeed names them
    return None if (Path(directory) / CPU_OP / f"{CPU_OP}.so").is_file() else CPU_OP


STALE_LOCK_S = 900
"""A build lock older than this was left by a stopped build (a build takes a minute or two, even on 2 busy cores)."""


def check_build_locks(directory: str | Path, now: float | None = None) -> None:
    """Refuse to start on a lock file that a stopped build left in the op cache: torch's builder waits for it
    to disappear and would hold every rank forever, silently."""
    now = time.time() if now is None else now
    for lock in sorted(Path(directory).glob("*/lock")):
        with contextlib.suppress(FileNotFoundError):  # a build that just finished removed it
            age = now - lock.stat().st_mtime
            if age > STALE_LOCK_S:
                old = f"{age / 3600:.0f} h" if age >= 7200 else f"{age / 60:.0f} min"
                raise ConfigError(
                    f"DeepSpeed's op cache holds a lock {old} old, {lock}, "
                    "left by a build that was stopped: torch's builder would wait for it forever",
                    hint=f"remove {lock} and start again",
                )


def prepare_environment(runtime: Any, environ: MutableMapping[str, str] | None = None) -> list[str]:
    """Make DeepSpeed use this rank's device; returns a note for each variable set (for rank 0's log).

    Call it before DeepSpeed is imported (the HF Trainer imports it while building its arguments):
    its accelerator is fixed then. Where it was imported already, the CPU accelerator is switched in.
    """
    environ = os.environ if environ is None else environ
    notes = []
    if "TORCH_EXTENSIONS_DIR" not in environ:
        environ["TORCH_EXTENSIONS_DIR"] = extensions_dir(environ)
        notes.append(
            f"TORCH_EXTENSIONS_DIR={environ['TORCH_EXTENSIONS_DIR']} (DeepSpeed's compiled ops are "
            "cached there; the first start builds them)"
        )
    own_ninja = Path(sys.executable).parent / "ninja"
    if "PATH" in environ and own_ninja.is_file() and shutil.which("ninja", path=environ["PATH"]) != str(own_ninja):
        # torch builds ops with the first ninja on PATH; two ninja versions keep incompatible build logs in
        # the same cache, so each would rebuild what the other built (a SLURM job's PATH vs a shell's)
        environ["PATH"] = f"{own_ninja.parent}{os.pathsep}{environ['PATH']}"
        notes.append(f"PATH starts with {own_ninja.parent} (DeepSpeed's ops are built with this environment's ninja)")
    if runtime.device.type == "cpu" and environ.get("DS_ACCELERATOR") != "cpu":
        # DeepSpeed would pick the GPU whenever CUDA is available and move the model there.
        environ["DS_ACCELERATOR"] = "cpu"
        notes.append("DS_ACCELERATOR=cpu (this run's device is the CPU; DeepSpeed would otherwise use a GPU)")
        if "deepspeed" in sys.modules:
            from deepspeed.accelerator import get_accelerator, set_accelerator  # noqa: PLC0415 (optional dependency)

            if get_accelerator().device_name() != "cpu":
                from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator  # noqa: PLC0415 (optional dependency)

                set_accelerator(CPU_Accelerator())
    index = str(runtime.device.index if runtime.device.type == "cuda" else runtime.local_rank)
    if environ.get("LOCAL_RANK") != index:
        # DeepSpeed asserts LOCAL_RANK is set (plain python, srun tasks) and uses it as the GPU index.
        said = (
            f"LOCAL_RANK={index} for DeepSpeed, which takes it as the GPU index "
            f"({runtime.device}; local rank {runtime.local_rank})"
        )
        environ["LOCAL_RANK"] = index
        if environ.get("OMPI_COMM_WORLD_LOCAL_RANK", index) != index:
            environ["OMPI_COMM_WORLD_LOCAL_RANK"] = index  # DeepSpeed asserts the two agree
            said += "; OMPI_COMM_WORLD_LOCAL_RANK likewise"
        notes.append(said)
    return notes


@dataclass(kw_only=True)
class DeepSpeedStrategy(StrategyBase):
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
    """Per-rank batch size (train_micro_batch_size_per_gpu); a training loop fills it in (with_batch)."""
    overrides: dict = field(default_factory=dict)
    """Extra top-level ds_config entries merged into a built config (e.g. zero_optimization details)."""

    name: str = "deepspeed"
    storage = NATIVE

    def __post_init__(self) -> None:
        if importlib.util.find_spec("deepspeed") is None:
            raise ConfigError(
                "strategy 'deepspeed' needs the package 'deepspeed', which is not installed",
                hint="pip install deepspeed, or use --strategy fsdp / zero1",
            )
        if self.stage not in STAGES:
            raise ConfigError(f"deepspeed stage={self.stage!r} is not a ZeRO stage", hint="use 0, 1, 2 or 3")
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"deepspeed precision={self.precision!r} unknown", hint=f"use one of {', '.join(PRECISIONS)}"
            )
        if self.gradient_accumulation_steps < 1:
            raise ConfigError(
                f"gradient_accumulation_steps={self.gradient_accumulation_steps} must be >= 1",
                hint="1 means no accumulation",
            )

    # -- configuration ---------------------------------------------------------------------------
    def with_batch(self, micro_batch_size: int, accumulation: int | None = None) -> DeepSpeedStrategy:
        """This strategy for a loop of ``micro_batch_size`` samples per rank and ``accumulation``
        micro-batches per optimizer step (DeepSpeed accumulates itself and must know both)."""
        if self.micro_batch_size not in (None, micro_batch_size):
            raise ConfigError(
                f"deepspeed:micro_batch_size={self.micro_batch_size}, but the per-rank batch is "
                f"{micro_batch_size} (--batch-size)",
                hint="leave micro_batch_size out: trainscale fills in the per-rank batch",
            )
        if accumulation is not None and self.gradient_accumulation_steps not in (1, accumulation):
            raise ConfigError(
                f"deepspeed:gradient_accumulation_steps={self.gradient_accumulation_steps}, but the "
                f"training loop accumulates {accumulation} micro-batch(es) per step",
                hint="leave gradient_accumulation_steps out and give the loop's own option (--grad-accum)",
            )
        return dataclasses.replace(
            self,
            micro_batch_size=micro_batch_size,
            gradient_accumulation_steps=accumulation or self.gradient_accumulation_steps,
        )

    def ds_config(self, world_size: int, device: str | None = None) -> dict[str, Any]:
        """The validated config this strategy will hand to DeepSpeed (usable in a preflight)."""
        if self.config is None:
            config = build_ds_config(
                micro_batch_size=self.micro_batch_size or 1,
                stage=self.stage,
                precision=self.precision,
                gradient_accumulation_steps=self.gradient_accumulation_steps,
            )
            config.update(self.overrides)
        else:
            config = dict(self.config) if isinstance(self.config, dict) else load_ds_config(self.config)
            given = config.get("train_micro_batch_size_per_gpu")
            if self.micro_batch_size is not None and given not in (None, "auto", self.micro_batch_size):
                raise ConfigError(
                    f"ds_config train_micro_batch_size_per_gpu={given}, but the per-rank batch size "
                    f"is {self.micro_batch_size} (--batch-size)",
                    hint=f"make them equal: --batch-size {given}, or remove the key from the ds_config",
                )
            if given in (None, "auto") and self.micro_batch_size is not None:
                config["train_micro_batch_size_per_gpu"] = self.micro_batch_size
            config.setdefault("zero_allow_untested_optimizer", True)
        return validate_ds_config(
            config,
            world_size,
            device=device,
            micro_option="--batch-size" if self.micro_batch_size is not None else None,
        )

    def preflight(self, world_size: int, device: str | None = None) -> None:
        self.ds_config(world_size, device)
        check_build_locks(extensions_dir())

    # -- the protocol ----------------------------------------------------------------------------
    def wrap(self, model: nn.Module, optimizer: OptimizerSource, runtime: Any) -> tuple[nn.Module, Any]:
        config = self.ds_config(runtime.world_size, runtime.device.type)
        for note in prepare_environment(runtime):
            runtime.print(f"trainscale: {note}")
        check_build_locks(os.environ["TORCH_EXTENSIONS_DIR"])
        one_rank_group(runtime)
        import deepspeed  # noqa: PLC0415 (optional dependency)

        names = parameter_names(model)
        model = model.to(runtime.device)
        client_optimizer = None if "optimizer" in config else build_optimizer(optimizer, model, names)
        cache = os.environ["TORCH_EXTENSIONS_DIR"]
        building = op_to_build(cache, runtime.device.type)
        if building:  # silence for a minute reads as a hang
            runtime.print(
                f"trainscale: DeepSpeed compiles {building} (once per environment, about a minute on 2 "
                f"cores; cached in {cache})"
            )
        started = time.monotonic()
        engine, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=client_optimizer, config=config)
        if building and not op_to_build(cache, runtime.device.type):
            runtime.print(f"trainscale: {building} compiled in {time.monotonic() - started:.0f} s")
        bf16 = config.get("bf16", config.get("bfloat16", {})).get("enabled")
        dtype = torch.bfloat16 if bf16 else torch.float16 if config.get("fp16", {}).get("enabled") else None
        if dtype is not None:
            engine.module.register_forward_pre_hook(_cast_inputs(dtype))
        return engine, optimizer

    def backward_loss(self, loss: torch.Tensor, model: Any) -> None:
        model.backward(loss)

    def micro_step(self, optimizer: Any, model: Any, *, last: bool) -> None:
        # Every micro-batch: the engine counts them and steps on its accumulation boundary itself.
        self.optimizer_step(optimizer, model)

    def optimizer_step(self, optimizer: Any, model: Any) -> None:
        if not self._grad_bytes and model.is_gradient_accumulation_boundary():
            self._grad_bytes = tensor_bytes(_gradient_tensors(model))
        model.step()  # steps the optimizer on accumulation boundaries and zeroes the gradients

    def zero_grad(self, optimizer: Any, model: Any) -> None:
        """Nothing: the engine's step zeroes the gradients."""

    def no_sync(self, model: Any) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()  # DeepSpeed skips the reduction itself (gradient_accumulation_steps)

    def unwrap(self, model: Any) -> nn.Module:
        return getattr(model, "module", model)

    def num_parameters(self, model: Any) -> int:
        # ZeRO-3 leaves empty placeholders in the module; ds_numel is each parameter's full size.
        return sum(getattr(p, "ds_numel", p.numel()) for p in self.unwrap(model).parameters())

    def check_compile(self) -> None:
        raise ConfigError(
            "--compile with --strategy deepspeed: trainscale compiles DDP and FSDP models; DeepSpeed's "
            "engine is compiled by DeepSpeed itself (engine.compile()), which trainscale does not drive",
            hint="leave --compile out with deepspeed, or use --strategy ddp, zero1 or fsdp",
        )

    def compile(self, model: Any) -> Any:
        self.check_compile()
        return model

    def torch_optimizer(self, optimizer: Any) -> torch.optim.Optimizer | None:
        # A ZeRO optimizer steps a torch optimizer on its flat partitions; that one carries the LR.
        return next(
            (c for c in (optimizer, getattr(optimizer, "optimizer", None)) if isinstance(c, torch.optim.Optimizer)),
            None,
        )

    def user_optimizer(self, optimizer: Any, model: Any) -> Any:
        return through_strategy(optimizer, self, model)  # opt.step() is the engine's step

    def full_model_state(self, model: Any) -> dict[str, torch.Tensor]:
        import deepspeed  # noqa: PLC0415 (optional dependency)

        with deepspeed.zero.GatheredParameters(list(model.module.parameters())):
            return {k: v.detach().clone() for k, v in model.module.state_dict().items()}

    def checkpoint_state(self, model: Any, optimizer: Any) -> ModelState:
        return EngineState(model)

    def held_bytes(self, model: Any, optimizer: Any) -> dict[str, int]:
        """At rest. Parameters: each one's ZeRO-3 partition (``ds_tensor``) plus the ones DeepSpeed keeps
        whole (below stage3_param_persistence_threshold, or stages 0-2); copies gathered for a forward
        are transient (they show in the peak). Optimizer: the torch optimizer's state plus DeepSpeed's
        fp32 master partition."""
        params = [
            p for p in model.module.parameters() if not hasattr(p, "ds_tensor") or getattr(p, "ds_persist", False)
        ]
        params += [p.ds_tensor for p in model.module.parameters() if hasattr(p, "ds_tensor")]
        zero = model.optimizer
        masters = getattr(zero, "single_partition_of_fp32_groups", None) or getattr(
            zero, "fp32_partitioned_groups_flat", []
        )
        state = state_tensors(getattr(zero, "optimizer", zero))
        return {
            "params": tensor_bytes(params),
            "grads": self._grad_bytes,
            "optimizer": tensor_bytes(list(masters) + state),
        }


class EngineState(ModelState):
    """DeepSpeed's own sharded files (``save_checkpoint``), inside trainscale's sharded checkpoint
    directory; they resume with the same world size."""

    storage = NATIVE

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def state_dict(self) -> dict[str, Any]:
        return {}  # everything is in DeepSpeed's files

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise CheckpointError("DeepSpeed state loads from its own files only", hint="use Checkpointer.restore")

    def write(self, directory: Path) -> None:
        self.engine.save_checkpoint(str(directory), tag=CHECKPOINT_TAG, save_latest=False)

    def read(self, directory: Path, record: dict[str, Any]) -> None:
        if record.get("format") != "deepspeed":
            raise CheckpointError(
                "this checkpoint was not written by the deepspeed strategy",
                hint="resume with the strategy that wrote it, or start a new checkpoint directory",
            )
        saved = int(record["world_size"])
        world = getattr(self.engine, "dp_world_size", saved)
        if saved != world:
            raise CheckpointError(
                f"{directory} holds DeepSpeed ZeRO shards for {saved} rank(s); this run has {world}",
                hint=f"resume with {saved} ranks, or under --strategy fsdp, zero1 or ddp, which read "
                "DeepSpeed's files on any number of ranks",
            )
        load_path, _ = self.engine.load_checkpoint(
            str(directory), tag=CHECKPOINT_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
        )
        if load_path is None:
            raise CheckpointError(f"DeepSpeed found no checkpoint under {directory}", hint="delete the directory")


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


def _cast_inputs(dtype: torch.dtype):
    def hook(module: nn.Module, args: tuple) -> tuple:
        return tuple(a.to(dtype) if torch.is_tensor(a) and a.is_floating_point() else a for a in args)

    return hook
