"""What a module and its batch say about themselves, read without changing either: the tensors in a forward's
output, the batch's samples and tokens, the module inside DDP/DeepSpeed/compile wrappers and which of those
wraps it, its device and dtype, autocast's. For the recorder (observe/hooks.py)."""

from __future__ import annotations

from typing import Any

import torch


def tensors(value: Any, depth: int = 0) -> list[torch.Tensor]:
    """The tensors in a forward's output: a tensor, a tuple/list/dict of them (an HF ModelOutput is a dict)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if depth > 2:
        return []
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v, depth + 1)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors(v, depth + 1)]
    return []


def batch_size(args: tuple, kwargs: dict) -> tuple[int | None, int | None]:
    """(samples, tokens) of a forward's input: its first tensor's first dimension; a 2-D integer input
    (token ids, B x T) also counts tokens. HF models take ``input_ids=`` by keyword."""
    first = args[0] if args else None
    if kwargs or type(first) is not torch.Tensor:  # mostly ``model(x)``: its first argument, at once (every step)
        first = kwargs.get("input_ids") if kwargs else None
        if not isinstance(first, torch.Tensor):
            first = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if first is None:
            found = tensors(args) or tensors(kwargs)
            first = found[0] if found else None
    shape = first.shape if first is not None else ()
    if not shape:
        return None, None
    tokens = shape[0] * shape[1] if len(shape) == 2 and not first.is_floating_point() else None
    return shape[0], tokens


def unwrap(module: torch.nn.Module) -> torch.nn.Module:
    """The user's module inside DDP, a DeepSpeed engine or torch.compile's wrapper."""
    for _ in range(4):
        inner = getattr(module, "module", None) or getattr(module, "_orig_mod", None)
        if not isinstance(inner, torch.nn.Module):
            return module
        module = inner
    return module


def strategy_of(module: torch.nn.Module) -> str:
    """What wraps the model, as trainscale's strategies are named."""
    names = {type(m).__name__ for m in (module, getattr(module, "module", None)) if m is not None}
    if "DeepSpeedEngine" in names or any("DeepSpeed" in n for n in names):
        stage = getattr(module, "zero_optimization_stage", lambda: None)()
        return f"deepspeed{f' zero{stage}' if stage else ''}"
    if "FullyShardedDataParallel" in names or type(module).__name__.startswith("FSDP"):
        return "fsdp"
    if "DistributedDataParallel" in names:
        return "ddp"
    return "none"


def shard_units(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The submodules FSDP shards as units of their own (the root is one more): the model's own
    ``_no_split_modules`` (its repeated blocks, the Hugging Face convention), else every direct child with
    parameters. strategies/fsdp.py wraps by it; the recorder counts them for ``trainscale plan``."""
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    if blocks:  # fully_shard renames a unit's class FSDP<name>
        return [m for m in model.modules() if type(m).__name__.removeprefix("FSDP") in blocks and m is not model]
    return [child for child in model.children() if any(True for _ in child.parameters())]


def unit_bytes(module: torch.nn.Module) -> list[int]:
    """Parameter bytes of each of :func:`shard_units`' outermost units (a unit inside another is counted in
    it), then the root's own (what is left)."""
    model = unwrap(module)
    units = shard_units(model)
    inner = {id(m) for u in units for m in u.modules() if m is not u}

    def size(m: torch.nn.Module) -> int:
        return sum(p.numel() * p.element_size() for p in m.parameters())

    sizes = [size(u) for u in units if id(u) not in inner]
    return [*sizes, max(0, size(model) - sum(sizes))]


def param_dtype(module: Any) -> torch.dtype:
    """The dtype ``module`` computes in: a sharded module's mixed-precision dtype (FSDP keeps fp32 shards and
    computes in its policy's ``param_dtype``: measured against the fp32 peak, a bf16 step's MFU would read
    about 15 times too high on a GPU), else its first floating parameter's."""
    if module is None:
        return torch.float32
    for sub in module.modules():
        policy = getattr(sub, "mixed_precision", None)  # FSDP1's, or FSDP2's (fully_shard) state's
        getter = getattr(sub, "_get_fsdp_state", None)
        if policy is None and getter is not None:
            try:
                policy = getattr(getter(), "_mp_policy", None)
            except Exception:  # torch's private state moved: the parameters' dtype stands
                policy = None
        if isinstance(getattr(policy, "param_dtype", None), torch.dtype):
            return policy.param_dtype
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)


def device_of(module: torch.nn.Module, args: tuple) -> torch.device:
    found = tensors(args)
    if found:
        return found[0].device
    param = next(module.parameters(), None)
    return param.device if param is not None else torch.device("cpu")


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The dtype autocast computes in on ``device`` now (the step's compute dtype for MFU), or None."""
    try:
        if torch.is_autocast_enabled(device.type):
            return torch.get_autocast_dtype(device.type)
    except (TypeError, AttributeError, RuntimeError):  # an older torch: the parameters' dtype counts
        pass
    return None
