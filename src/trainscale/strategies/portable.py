"""Model and optimizer state that crosses strategies: a checkpoint of ddp or zero1 (one rank-0 file, the
optimizer's state keyed by position as torch saves it) resumes under fsdp, and fsdp's DCP shards resume under
ddp or zero1, on any number of ranks; DeepSpeed ZeRO's own files resume under any of the three. The bridge is
parameter names: torch's ``get_state_dict`` form keys the
optimizer's state by them, and DCP reshards whatever it loads into the layout asked for."""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import tempfile
import zlib
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.optim import ZeroRedundancyOptimizer

from trainscale.env import detect
from trainscale.errors import CheckpointError
from trainscale.strategies.deepspeed import CHECKPOINT_TAG


def optimizer_names(module: nn.Module, optimizer: Any) -> list[str]:
    """The names of ``optimizer``'s parameters in its param_groups' order: the positions torch's
    ``optimizer.state_dict()`` keys its state by."""
    names = {id(p): name for name, p in module.named_parameters()}
    return [
        names.get(id(p), f"<unnamed {i}>")
        for i, p in enumerate(p for group in optimizer.param_groups for p in group["params"])
    ]


def by_position(state: dict[str, Any]) -> bool:
    """Whether an optimizer state is keyed by position (torch's ``optimizer.state_dict()``), not by name."""
    return any(isinstance(i, int) for group in state.get("param_groups", []) for i in group["params"])


def by_name(state: dict[str, Any], names: list[str], where: Any) -> dict[str, Any]:
    """torch's position-keyed optimizer state -> the same keyed by parameter name; a state of another number
    of parameters is another model's (CheckpointError)."""
    positions = [i for group in state["param_groups"] for i in group["params"]]
    if sorted(positions) != list(range(len(names))):
        raise CheckpointError(
            f"{where} holds the optimizer state of {len(positions)} parameters; this model's "
            f"optimizer has {len(names)}: it was written for another model",
            hint=ANOTHER,
        )
    return {
        "state": {names[i]: value for i, value in state["state"].items()},
        "param_groups": [{**group, "params": [names[i] for i in group["params"]]} for group in state["param_groups"]],
    }


def portable_optimizer(optimizer: Any) -> Any:
    """A plain torch optimizer over the same parameters, groups and options as ``optimizer`` (itself, for a plain
    one; ZeRO's holds its whole state only once consolidated): what ``get_state_dict`` can name and fill."""
    if not isinstance(optimizer, ZeroRedundancyOptimizer):
        return optimizer
    groups = [{**group, "params": list(group["params"])} for group in optimizer.param_groups]
    return optimizer._optim_constructor(groups, **optimizer._optim_defaults)


def from_shards(module: nn.Module, optimizer: Any, shards: Any) -> dict[str, Any]:
    """A sharded checkpoint of any strategy and world size (DCP's shards, or DeepSpeed's own files), read whole
    into ``module``'s layout: the ``{"model", "optimizer"}`` a rank-0 file of this module holds (optimizer state
    keyed by position). Every rank calls it (DCP's load is a collective)."""
    plain = portable_optimizer(optimizer)
    if shards.format == "deepspeed":
        whole = deepspeed_once_per_node(shards.path / CHECKPOINT_TAG)
        return {
            "model": whole["model"],
            "optimizer": named_to_positions(whole["optimizer"], module, plain, shards.path),
        }
    model_state, optim_state = get_state_dict(module, plain)
    loaded = shards.load({"model": model_state, "optimizer": optim_state})
    set_state_dict(module, plain, model_state_dict=loaded["model"], optim_state_dict=loaded["optimizer"])
    return {"model": module.state_dict(), "optimizer": plain.state_dict()}


ANOTHER = (
    "start a new checkpoint directory (--fresh moves these checkpoints aside), or resume with the model "
    "and optimizer that wrote it"
)


def deepspeed_once_per_node(directory: Any) -> dict[str, Any]:
    """:func:`from_deepspeed`, merged by one rank per node (local rank 0) into a node-local file (``TMPDIR``) that
    the node's ranks then memory-map: the merged state (12 bytes a parameter under Adam: ~84 GB for 7B) sits in
    the node's memory once, not once per rank. Every rank calls it (two barriers)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return from_deepspeed(directory)

    found = detect()
    first = dist.get_rank() - found.local_rank  # the node's first rank: one file per node, whatever TMPDIR is
    key = zlib.crc32(
        f"{Path(directory).resolve()} {os.environ.get('MASTER_ADDR')} {os.environ.get('MASTER_PORT')}".encode()
    )
    path = Path(tempfile.gettempdir()) / f"trainscale-deepspeed-{key:08x}-{first}.pt"
    failed: Exception | None = None
    if found.local_rank == 0:
        try:
            whole = from_deepspeed(directory)
            torch.save(whole, path.with_suffix(".part"))
            os.replace(path.with_suffix(".part"), path)
        except Exception as exc:  # said after the barrier: the node's other ranks must not wait forever
            failed = exc
    dist.barrier()
    try:
        if failed is not None:
            raise failed
        if not path.exists():
            raise CheckpointError(
                f"{directory}: local rank 0 of this node could not convert DeepSpeed's files to {path}",
                hint="see local rank 0's error (free space in TMPDIR for the merged "
                "state: 12 bytes a parameter under Adam)",
            )
        return torch.load(path, map_location="cpu", mmap=True, weights_only=True)
    finally:
        dist.barrier()  # every rank has mapped it: the name can go (the mappings stay)
        if found.local_rank == 0:
            path.unlink(missing_ok=True)
            path.with_suffix(".part").unlink(missing_ok=True)


def from_deepspeed(directory: Any) -> dict[str, Any]:
    """DeepSpeed ZeRO's own files (``directory``: the tag folder ``save_checkpoint`` wrote; stages 1-3, any world
    size) as whole state keyed by parameter name: ``{"model": fp32 master weights and buffers, "optimizer":
    {"state": {name: ...}, "param_groups": [{..., "params": [names]}]}}``. Every flat ZeRO partition (the
    masters and each tensor of the base optimizer's state: Adam's moments, SGD's momentum...) is merged over the
    ranks and cut at the parameters by DeepSpeed's own zero_to_fp32 helpers; the files are read by torch's
    weights-only loader (DeepSpeed's three classes admitted: nothing else runs) and memory-mapped; the merged
    state is held whole (one rank per node does it: :func:`deepspeed_once_per_node`)."""
    try:
        from deepspeed.utils import zero_to_fp32 as z  # noqa: PLC0415 (optional dependency)
    except ImportError as exc:
        raise CheckpointError(
            f"{directory} holds DeepSpeed's own files, which need DeepSpeed installed to read",
            hint="install DeepSpeed (pip install deepspeed), or resume with --strategy deepspeed where it is installed",
        ) from exc
    directory = Path(directory)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # the helpers print their progress
            return _merged_deepspeed(z, directory, torch)
    except CheckpointError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, RuntimeError, OSError, pickle.UnpicklingError) as exc:
        raise CheckpointError(
            f"{directory} holds DeepSpeed files trainscale cannot convert ({type(exc).__name__}: {str(exc)[:200]})",
            hint="resume it with --strategy deepspeed on the number of ranks that wrote it",
        ) from exc


def _deepspeed_globals() -> list:
    """The classes DeepSpeed's optimizer files pickle besides tensors (its loss scaler, its ZeRO-stage enum, its
    fragment addresses): admitted to torch's weights-only loader, which rebuilds them without running any other
    code (docs/security.md)."""
    out = []
    for module, name in (
        ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
        ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
        ("deepspeed.utils.tensor_fragment", "fragment_address"),
    ):
        try:
            out.append(getattr(__import__(module, fromlist=[name]), name))
        except (ImportError, AttributeError):  # another DeepSpeed version: a file that needs it is refused
            pass
    return out


def _model_states(z: Any, directory: Any, torch: Any) -> list:
    """DeepSpeed's model-state files as its zero_to_fp32 helpers take them (``parse_model_states``'s work, read
    with torch's weights-only loader instead of full unpickling)."""
    out = []
    for path in z.get_model_state_files(str(directory)):
        state = torch.load(path, map_location="cpu", weights_only=True)
        if "buffer_names" not in state:
            raise ValueError(f"{path} is not a DeepSpeed model state file")
        buffers = {
            k: v.float() if v.is_floating_point() else v
            for k, v in state["module"].items()
            if k in state["buffer_names"]
        }
        out.append(
            z.zero_model_state(
                buffers=buffers,
                param_shapes=state["param_shapes"],
                shared_params=[[k, v] for k, v in state["shared_params"].items()],
                ds_version=state.get("ds_version"),
                frozen_param_shapes=state.get("frozen_param_shapes"),
                frozen_param_fragments=state.get("frozen_param_fragments"),
            )
        )
    return out


def _merged_deepspeed(z: Any, directory: Any, torch: Any) -> dict[str, Any]:
    models = _model_states(z, directory, torch)
    with torch.serialization.safe_globals(_deepspeed_globals()):
        optims = [
            torch.load(f, map_location="cpu", mmap=True, weights_only=True)["optimizer_state_dict"]
            for f in z.get_optim_files(str(directory))
        ]
    stage = int(optims[0]["zero_stage"])
    count = optims[0]["partition_count"]
    world = max(count) if isinstance(count, list) else int(count)
    paddings = optims[0].get("param_alignment_paddings")
    shapes = models[0].param_shapes  # one entry per flat partition: a group (stages 1-2), a sub-group (stage 3)

    def merged(flat_groups: list) -> dict[str, Any]:
        if stage <= 2:
            out = z._get_fp32_state_dict_from_zero2_checkpoint(world, flat_groups, models, False, paddings)
        else:
            out = z._get_fp32_state_dict_from_zero3_checkpoint(world, flat_groups, models, False)
        return {k: v.detach().clone() for k, v in z.to_torch_tensor(out).items()}

    model = merged([o["single_partition_of_fp32_groups" if stage <= 2 else "fp32_flat_groups"] for o in optims])
    base = [o.get("base_optimizer_state") or o["optimizer_state_dict"] for o in optims]  # stages 1-2, 3
    flats = [base[r]["state"] for r in range(len(base))]
    first = flats[0][min(flats[0])] if flats[0] else {}
    partitioned = [k for k, v in first.items() if torch.is_tensor(v) and v.dim() == 1]
    per_param = {k: v for k, v in first.items() if k not in partitioned}  # "step" and other numbers
    names_of = [n for group in shapes for n in group]
    state: dict[str, dict[str, Any]] = {
        n: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in per_param.items()} for n in names_of
    }
    for key in partitioned:
        for name, value in merged([[s[i][key] for i in sorted(s)] for s in flats]).items():
            if name in state:
                state[name][key] = value
    groups, taken = [], 0
    for group in base[0]["param_groups"]:  # each holds its flat partitions' indices (its sub-groups, stage 3)
        parts = shapes[taken : taken + len(group["params"])]
        taken += len(group["params"])
        groups.append(
            {**{k: v for k, v in group.items() if k != "params"}, "params": [n for part in parts for n in part]}
        )
    if taken != len(shapes):
        raise CheckpointError(
            f"{directory}: its optimizer's {len(base[0]['param_groups'])} group(s) cover "
            f"{taken} of its {len(shapes)} flat partitions",
            hint="resume it with --strategy deepspeed",
        )
    return {"model": model, "optimizer": {"state": {n: v for n, v in state.items() if v}, "param_groups": groups}}


def named_to_positions(optim: dict[str, Any], module: nn.Module, optimizer: Any, where: Any) -> dict[str, Any]:
    """A name-keyed optimizer state (:func:`from_deepspeed`) in ``optimizer``'s own layout, keyed by position as
    torch's ``optimizer.state_dict()`` is: each of its groups with the saved group's options for its parameters;
    parameters the checkpoint has no state for (frozen ones, say) start without. A saved parameter this model does
    not have: another model's checkpoint (CheckpointError)."""
    names = optimizer_names(module, optimizer)
    position = {n: i for i, n in enumerate(names)}
    unknown = sorted(set(optim["state"]) - set(position))
    if unknown:
        raise CheckpointError(
            f"{where} holds optimizer state for {len(unknown)} parameter(s) this model's optimizer "
            f"does not have ({', '.join(unknown[:3])}): it was written for another model",
            hint=ANOTHER,
        )
    group_of = {n: g for g in optim["param_groups"] for n in g["params"]}
    groups, start = [], 0
    for group in optimizer.param_groups:
        mine = names[start : start + len(group["params"])]
        saved = next((group_of[n] for n in mine if n in group_of), None)
        options = {k: v for k, v in (saved or group).items() if k != "params"}
        groups.append({**options, "params": list(range(start, start + len(mine)))})
        start += len(mine)
    return {"state": {position[n]: v for n, v in optim["state"].items()}, "param_groups": groups}
