"""GPU random-number state on resume, with torch's per-device RNG calls faked at their narrow seam
(``torch.cuda.get_rng_state`` / ``set_rng_state`` / ``get_rng_state_all`` and the device count):
no GPU here, and the code under test only moves these states around."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn

from trainscale.runtime.seed import rng_state, set_rng_state


class FakeCudaRng:
    """Per-device generator states as plain tensors; ``draw(i)`` advances device i like dropout would."""

    def __init__(self, devices: int) -> None:
        self.states = {i: torch.tensor([0], dtype=torch.uint8) for i in range(devices)}

    def index(self, device) -> int:
        if device is None or device == "cuda":
            return 0
        index = torch.device(device).index if not isinstance(device, int) else device
        if index not in self.states:
            raise IndexError(f"fake CUDA: device {index} is not visible ({len(self.states)} visible)")
        return index

    def get(self, device="cuda"):
        return self.states[self.index(device)].clone()

    def set(self, state, device="cuda"):
        self.states[self.index(device)] = state.clone()

    def get_all(self):
        return [self.states[i].clone() for i in sorted(self.states)]

    def set_all(self, states):
        for i, state in enumerate(states):
            self.set(state, i)

    def draw(self, index: int) -> None:
        self.states[index] += 1


def install(monkeypatch, devices: int) -> FakeCudaRng:
    fake = FakeCudaRng(devices)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: devices)
    monkeypatch.setattr(torch.cuda, "get_rng_state", fake.get)
    monkeypatch.setattr(torch.cuda, "set_rng_state", fake.set)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", fake.get_all)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", fake.set_all)
    return fake


def test_a_checkpoint_from_8_visible_gpus_resumes_on_a_task_that_sees_one(monkeypatch):
    """Saved by rank 0 under torchrun (8 GPUs visible), resumed by srun tasks with one GPU each:
    the every-GPU list raised IndexError there; rank 0's own GPU state is what is saved now."""
    saved_side = install(monkeypatch, devices=8)
    saved_side.draw(0), saved_side.draw(0)  # rank 0 trained on cuda:0
    state = rng_state(torch.device("cuda", 0))
    assert torch.equal(state["cuda"], torch.tensor([2], dtype=torch.uint8))

    resumed_side = install(monkeypatch, devices=1)
    set_rng_state(state, torch.device("cuda", 0))
    assert torch.equal(resumed_side.states[0], torch.tensor([2], dtype=torch.uint8))


def test_rank_k_restores_the_trained_state_into_its_own_gpu(monkeypatch):
    """All 4 GPUs visible: rank 3 drives cuda:3 and must continue from the trained state (rank 0's
    cuda:0 state, equal to its own in an uninterrupted run), not from cuda:3's untouched one."""
    fake = install(monkeypatch, devices=4)
    for index in range(4):
        fake.draw(index)  # every rank drew once on its own GPU
    state = rng_state(torch.device("cuda", 0))
    fresh = install(monkeypatch, devices=4)
    set_rng_state(state, torch.device("cuda", 3))
    assert torch.equal(fresh.states[3], torch.tensor([1], dtype=torch.uint8))


def test_a_cpu_rank_never_touches_cuda(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a CPU rank created a CUDA context")

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state", refuse)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", refuse)
    monkeypatch.setattr(torch.cuda, "set_rng_state", refuse)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", refuse)
    state = rng_state(torch.device("cpu"))
    assert "cuda" not in state
    set_rng_state({**state, "cuda": torch.tensor([1], dtype=torch.uint8)}, torch.device("cpu"))


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_the_discarded_bucket_rebuild_step_leaves_the_gpu_generator_as_it_was(monkeypatch, tmp_path, one_rank_group):
    """Dropout on a GPU draws from the GPU's generator: the resume-time warm-up step must give those
    draws back too, or the resumed run's dropout masks differ from the uninterrupted run's."""
    from torch.nn.parallel import DistributedDataParallel

    # torch may point TORCHINDUCTOR_CACHE_DIR somewhere on first use; monkeypatch restores it
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))

    from trainscale.strategies.ddp import rebuild_buckets

    fake = install(monkeypatch, devices=2)
    model = DistributedDataParallel(nn.Linear(4, 2))
    cpu_before = torch.get_rng_state()

    def forward_backward():
        fake.draw(1)  # a dropout mask on cuda:1
        model(torch.randn(3, 4)).sum().backward()  # and a CPU draw

    rebuild_buckets(model, forward_backward, device=torch.device("cuda", 1))
    assert torch.equal(fake.states[1], torch.tensor([0], dtype=torch.uint8))
    assert torch.equal(torch.get_rng_state(), cpu_before)
    assert all(p.grad is None for p in model.parameters())
