"""Model and optimizer state that crosses strategies: a checkpoint of ddp or zero1 (one rank-0 file, the
optimizer's state keyed by position as torch saves it) resumes under fsdp, and fsdp's DCP shards resume under
ddp or zero1, on any number of ranks; DeepSpeed ZeRO's own files resume under any of the three. The bridge is parameter names: torch's ``get_state_dict`` form keys the
optimizer's state by them, and DCP reshards whatever it loads into the layout asked for."""

from __future__ import annotations

from typing import Any

from torch import nn

from trainscale.errors import CheckpointError


def optimizer_names(module: nn.Module, optimizer: Any) -> list[str]:
    """The names of ``optimizer``'s parameters in its param_groups' order: the positions torch's
    ``optimizer.state_dict()`` keys its state by."""
    names = {id(p): name for name, p in module.named_parameters()}
    return [names.get(id(p), f"<unnamed {i}>")
            for i, p in enumerate(p for group in optimizer.param_groups for p in group["params"])]


def by_position(state: dict[str, Any]) -> bool:
    """Whether an optimizer state is keyed by position (torch's ``optimizer.state_dict()``), not by name."""
    return any(isinstance(i, int) for group in state.get("param_groups", []) for i in group["params"])


def by_name(state: dict[str, Any], names: list[str], where: Any) -> dict[str, Any]:
    """torch's position-keyed optimizer state -> the same keyed by parameter name; a state of another number
    of parameters is another model's (CheckpointError)."""
    positions = [i for group in state["param_groups"] for i in group["params"]]
    if sorted(positions) != list(range(len(names))):
        raise CheckpointError(f"{where} holds the optimizer state of {len(positions)} parameters; this model's "
                              f"optimizer has {len(names)}: it was written for another model", hint=ANOTHER)
    return {"state": {names[i]: value for i, value in state["state"].items()},
            "param_groups": [{**group, "params": [names[i] for i in group["params"]]}
                             for group in state["param_groups"]]}


def portable_optimizer(optimizer: Any) -> Any:
    """A plain torch optimizer over the same parameters, groups and options as ``optimizer`` (itself, for a plain
    one; ZeRO's holds its whole state only once consolidated): what ``get_state_dict`` can name and fill."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    if not isinstance(optimizer, ZeroRedundancyOptimizer):
        return optimizer
    groups = [{**group, "params": list(group["params"])} for group in optimizer.param_groups]
    return optimizer._optim_constructor(groups, **optimizer._optim_defaults)


def from_shards(module: nn.Module, optimizer: Any, shards: Any) -> dict[str, Any]:
    """A sharded checkpoint of any strategy and world size (DCP's shards, or DeepSpeed's own files), read whole
    into ``module``'s layout: the ``{"model", "optimizer"}`` a rank-0 file of this module holds (optimizer state
    keyed by position). Every rank calls it (DCP's load is a collective)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if shards.format == "deepspeed":
        from trainscale.strategies.deepspeed import CHECKPOINT_TAG

        return from_deepspeed(shards.path / CHECKPOINT_TAG)
    plain = portable_optimizer(optimizer)
    model_state, optim_state = get_state_dict(module, plain)
    loaded = shards.load({"model": model_state, "optimizer": optim_state})
    set_state_dict(module, plain, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"])
    return {"model": module.state_dict(), "optimizer": plain.state_dict()}


ANOTHER = ("start a new checkpoint directory (--fresh moves these checkpoints aside), or resume with the model "
           "and optimizer that wrote it")


def from_deepspeed(directory: Any) -> dict[str, Any]:
    """DeepSpeed ZeRO's own files (``directory``: the tag folder ``save_checkpoint`` wrote; any stage, any world
    size) as the ``{"model", "optimizer"}`` a ddp rank-0 file holds: the fp32 master weights and the base
    optimizer's state, each flat partition merged and cut at the parameters by DeepSpeed's own zero_to_fp32
    helpers, the state keyed by position in the param groups' order. Every rank reads the files (they are small
    next to a rank's share of a model large enough to need ZeRO-3)."""
    import contextlib
    import io
    from pathlib import Path

    import torch

    try:
        from deepspeed.utils import zero_to_fp32 as z
    except ImportError as exc:
        raise CheckpointError(f"{directory} holds DeepSpeed's own files, which need DeepSpeed installed to read",
                              hint="pip install deepspeed (trainscale[deepspeed]), or resume with --strategy "
                                   "deepspeed where it is installed") from exc
    directory = Path(directory)
    with contextlib.redirect_stdout(io.StringIO()):  # the helpers print their progress
        models = z.parse_model_states(z.get_model_state_files(str(directory)))
        files = z.get_optim_files(str(directory))
        optims = [torch.load(f, map_location="cpu", weights_only=False)["optimizer_state_dict"] for f in files]
        stage = int(optims[0]["zero_stage"])
        world = max(optims[0]["partition_count"]) if isinstance(optims[0]["partition_count"], list) \
            else int(optims[0]["partition_count"])
        paddings = optims[0].get("param_alignment_paddings")

        def merged(flat_groups: list) -> dict[str, torch.Tensor]:
            if stage <= 2:
                out = z._get_fp32_state_dict_from_zero2_checkpoint(world, flat_groups, models, False, paddings)
            else:
                out = z._get_fp32_state_dict_from_zero3_checkpoint(world, flat_groups, models, False)
            return z.to_torch_tensor(out)

        key = "single_partition_of_fp32_groups" if stage <= 2 else "fp32_flat_groups"
        model = merged([o[key] for o in optims])
        base = [o.get("base_optimizer_state") or o["optimizer_state_dict"] for o in optims]  # stages 1-2, 3
        moments = {}
        for name in ("exp_avg", "exp_avg_sq"):
            if all(name in s for s in base[0]["state"].values()):
                moments[name] = merged([[b["state"][i][name] for i in sorted(b["state"])] for b in base])
    names = [n for shapes in models[0].param_shapes for n in shapes]
    steps = [b["step"] for b in base[0]["state"].values() if "step" in b]
    step = torch.as_tensor(steps[0], dtype=torch.float32).clone() if steps else None
    state = {}
    for position, name in enumerate(names):
        entry = {k: v[name].detach().clone() for k, v in moments.items()}
        if step is not None:
            entry["step"] = step.clone()
        if entry:
            state[position] = entry
    groups, start = [], 0
    for shapes, group in zip(models[0].param_shapes, base[0]["param_groups"]):
        groups.append({**{k: v for k, v in group.items() if k != "params"},
                       "params": list(range(start, start + len(shapes)))})
        start += len(shapes)
    if len(groups) != len(models[0].param_shapes):  # ZeRO-3 sub-groups: one torch group for them all
        groups = [{**{k: v for k, v in base[0]["param_groups"][0].items() if k != "params"},
                   "params": list(range(len(names)))}]
    return {"model": {k: v.detach().clone() for k, v in model.items()}, "optimizer": {"state": state, "param_groups": groups}}
