"""What one rank's training state holds, measured on the script as it is (for ``trainscale plan``'s calibration
run): the bytes of its parameters, gradients and optimizer state, and of the activations its forward keeps for
backward, at the batch it ran. The recorder (observe/hooks.py) turns it on when ``TRAINSCALE_PLAN_STEPS`` is set:
it counts during the first steps and, after that many optimizer steps, writes a ``state`` record and ends the
process with exit status 0 (the calibration needs no more of the run).

Counting only looks: each tensor is measured once (the same storage, offset and shape), the saved-tensor hooks
hand every tensor back unchanged. What it cannot see (a custom CUDA kernel's workspace, the allocator's slack, buffers a
library frees before backward) is stated with the figures by the plan, not guessed.
"""

from __future__ import annotations

from typing import Any

import torch

PLAN_STEPS_VAR = "TRAINSCALE_PLAN_STEPS"
PLAN_ALONE_VAR = "TRAINSCALE_PLAN_ALONE"
"""``1``: the calibration of a script that calls ``rt.setup`` wraps its model as it will on several ranks (DDP over
a group of one), so that its pace carries the strategy's own work per step (train/session.py)."""


def _key(t: torch.Tensor) -> tuple | None:
    """What makes two tensors the same memory: the same storage, offset and shape (a view of a larger tensor
    is counted as its own slice: the input batch ``x[i:i + 32]`` is 32 rows, not the whole data set)."""
    try:
        return t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), str(t.device)
    except (RuntimeError, NotImplementedError):  # a tensor without storage (a subclass)
        return None


def _bytes(found: list[torch.Tensor], skip: set | frozenset = frozenset()) -> int:
    """Bytes of ``found``, each tensor once, leaving out those in ``skip``."""
    seen: set = set(skip)
    total = 0
    for t in found:
        key = _key(t)
        if key is not None and key in seen:
            continue
        if key is not None:
            seen.add(key)
        total += t.numel() * t.element_size()
    return total


def _parameters(optimizer: Any) -> list[torch.Tensor]:
    return [
        p
        for group in getattr(optimizer, "param_groups", [])
        for p in group.get("params", [])
        if isinstance(p, torch.Tensor)
    ]


class StateCount:
    """Bytes of one rank's state: parameters and gradients before the first optimizer step, optimizer state after
    it, activations of the first step (the tensors autograd saved for backward from the model's forward to the
    optimizer's step: the loss's included)."""

    def __init__(self) -> None:
        self.params = self.grads = self.optimizer = self.activations = 0
        self.dtypes: set[str] = set()
        self.groups: list[list[int]] = []
        """Each optimizer parameter group's parameter sizes (elements): how ZeRO-1 partitions them."""
        self.samples: int | None = None
        self._saved: dict[tuple, tuple[int, int]] = {}
        """What the forward saved, by its key: (its storage's address, its bytes). Sizes only: holding the tensors
        would keep them alive past their backward and raise the calibration's own peak."""
        self._batches: list[dict[tuple, tuple[int, int]]] = []
        self._hooks: Any = None
        self.counted_forward = False

    # -- activations: the forward of the first step -----------------------------------------------
    def forward_started(self) -> None:
        if self._hooks is not None:  # the next micro-batch of the same step (gradient accumulation): counted apart,
            self._batches.append(self._saved)  # the previous one's activations are freed by its backward
            self._saved = {}
            return
        if self.counted_forward:
            return

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            key = _key(tensor)
            if key is not None:
                self._saved.setdefault(key, (key[0], tensor.numel() * tensor.element_size()))
            return tensor  # handed back unchanged: training is the same

        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor)
        self._hooks.__enter__()

    def forward_ended(self, samples: int | None) -> None:
        """The lead module's forward ended; the counting goes on through the loss (computed outside the model in
        most scripts: its log-softmax is an LM's largest activation) until the optimizer's step."""
        if self._hooks is not None and self.samples is None:
            self.samples = samples

    # -- the optimizer's step ---------------------------------------------------------------------
    def before_step(self, optimizer: Any) -> None:
        if self._hooks is not None:  # on the thread that entered them (backward's threads never see them)
            self._hooks.__exit__(None, None, None)
            self._hooks = None
            self.counted_forward = True
        params = _parameters(optimizer)
        if not params or self.params:
            return
        self.params = _bytes(params)
        self.groups = [
            [p.numel() for p in group.get("params", []) if isinstance(p, torch.Tensor)]
            for group in getattr(optimizer, "param_groups", [])
        ]
        self.grads = _bytes([p.grad for p in params if p.grad is not None])
        self.dtypes = {str(p.dtype).replace("torch.", "") for p in params}
        # the weights a layer saves for its backward are the parameters, not activations, in any view of them
        # (a Linear saves its weight transposed: the same storage, another shape)
        storages = {k[0] for k in map(_key, params) if k is not None}
        self.activations = max(
            sum(size for address, size in saved.values() if address not in storages)
            for saved in [*self._batches, self._saved]
        )  # the largest micro-batch's
        self._saved, self._batches = {}, []

    def after_step(self, optimizer: Any) -> None:
        state = getattr(optimizer, "state", {})
        found = [
            v
            for entry in state.values()
            if isinstance(entry, dict)
            for v in entry.values()
            if isinstance(v, torch.Tensor) and v.dim() > 0
        ]  # Adam's step counter is a scalar: no state
        self.optimizer = max(self.optimizer, _bytes(found))

    def record(self) -> dict[str, Any]:
        return {
            "kind": "state",
            "params_bytes": self.params,
            "grads_bytes": self.grads,
            "optimizer_bytes": self.optimizer,
            "activation_bytes": self.activations,
            "activation_samples": self.samples,
            "param_dtypes": sorted(self.dtypes),
            "param_groups": self.groups,
        }
