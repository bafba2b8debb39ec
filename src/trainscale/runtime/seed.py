"""Seed every random number generator a training script touches, and save/restore them for resume."""

from __future__ import annotations

import random

import numpy as np
import torch


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device


def rng_state(device: torch.device | None = None) -> dict:
    """All RNG states in a form `torch.load(weights_only=True)` accepts (tensors, ints, tuples).

    ``device``: this rank's device. On a GPU only *its* generator is saved (``cuda``, one state):
    the other visible GPUs belong to other ranks, and a resumed run may see fewer of them (one GPU
    per task, or a smaller node), so a list of every visible GPU's state could not be restored.
    A CPU rank never touches CUDA here (that would create a context on GPU 0 for every rank).
    """
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
        "torch": torch.get_rng_state(),
    }
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict, device: torch.device | None = None) -> None:
    """Restore :func:`rng_state`'s states; the GPU state goes into ``device``, this rank's GPU.

    Checkpoints are written by rank 0, so every rank restores rank 0's states: the ranks are seeded
    alike and draw alike, so in an uninterrupted run they hold the same states too.
    """
    python = state["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))
    np_state = state["numpy"]
    np.random.set_state(
        (
            np_state["kind"],
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["gauss"],
        )
    )
    torch.set_rng_state(state["torch"])
    saved = state.get("cuda")
    if saved is None or device is None or device.type != "cuda":
        return
    torch.cuda.set_rng_state(saved, device)
