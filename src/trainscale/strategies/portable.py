"""Model and optimizer state that crosses strategies: a checkpoint of ddp or zero1 (one rank-0 file, the
optimizer's state keyed by position as torch saves it) resumes under fsdp, and fsdp's DCP shards resume under
ddp or zero1, on any number of ranks. The bridge is parameter names: torch's ``get_state_dict`` form keys the
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
    """A sharded (DCP) checkpoint of any strategy and world size, read whole into ``module``'s layout: the
    ``{"model", "optimizer"}`` a rank-0 file of this module holds (optimizer state keyed by position). Every
    rank calls it (DCP's load is a collective)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    plain = portable_optimizer(optimizer)
    model_state, optim_state = get_state_dict(module, plain)
    loaded = shards.load({"model": model_state, "optimizer": optim_state})
    set_state_dict(module, plain, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"])
    return {"model": module.state_dict(), "optimizer": plain.state_dict()}


ANOTHER = ("start a new checkpoint directory (--fresh moves these checkpoints aside), or resume with the model "
           "and optimizer that wrote it")
