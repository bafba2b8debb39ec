"""The global data cursor (issue 36 item 1): a loader state saved at any step on S ranks resumes on R ranks
(S, R in 1..4) and the epoch's samples are each trained once. The ranks here are loaders with explicit rank and
world size in one process, stepped in lockstep as DDP steps them; the real ranks are in
tests/integration/test_reshape_resume.py."""

from __future__ import annotations

import collections
import random

import pytest
import torch
from torch.utils.data import TensorDataset

from trainscale.data import DeviceTensorLoader, DistributedLoader
from trainscale.data.loader import epoch_order
from trainscale.errors import ConfigError

N, BATCH, SEED = 97, 3, 11


def make(kind: str, rank: int, world: int):
    if kind == "tensor":
        return DeviceTensorLoader(torch.arange(N), batch_size=BATCH, rank=rank, world_size=world, seed=SEED)
    return DistributedLoader(TensorDataset(torch.arange(N)), batch_size=BATCH, rank=rank, world_size=world, seed=SEED)


def lockstep(passes):
    """Every rank's next batch, as DDP's ranks take them: all have one, or none has (each rank's own loop)."""
    while True:
        batches = [next(p, None) for p in passes]
        if all(b is None for b in batches):
            return
        assert all(b is not None for b in batches), "the ranks' passes have different lengths: DDP would hang"
        yield batches


def train(kind: str, shapes: list[int], stops: list[int], epochs: int) -> dict[int, list[int]]:
    """Sample ids trained per epoch by a run on ``shapes[0]`` ranks, stopped after ``stops[i]`` steps of its
    attempt i and resumed (from the state rank 0 saved) on ``shapes[i + 1]`` ranks; ``trained["ended_on"]``: the
    world size that finished each epoch."""
    trained: dict = collections.defaultdict(list)
    trained["ended_on"] = {}
    state = None
    for attempt, world in enumerate(shapes):
        loaders = [make(kind, r, world) for r in range(world)]
        if state is not None:
            for loader in loaders:
                loader.load_state_dict(state)
        budget = stops[attempt] if attempt < len(stops) else None
        steps = 0
        while loaders[0].state_dict()["epoch"] < epochs and (budget is None or steps < budget):
            epoch = loaders[0].state_dict()["epoch"]
            passes = [iter(loader) for loader in loaders]
            for batches in lockstep(passes):  # a step: every rank's next batch
                trained["ended_on"][epoch] = world
                for batch in batches:
                    trained[epoch] += batch[0].tolist()
                steps += 1
                if budget is not None and steps == budget:
                    break
            else:
                continue
            break
        states = [loader.state_dict() for loader in loaders]
        assert all(s == states[0] for s in states), states  # a global cursor: every rank says the same
        state = states[0]
    return trained


def check_once(trained: dict, epochs: int) -> None:
    for epoch in range(epochs):
        last_world = trained["ended_on"][epoch]
        ids = trained[epoch]
        assert len(ids) == len(set(ids)), f"epoch {epoch}: {len(ids) - len(set(ids))} sample(s) trained twice"
        order = epoch_order(N, SEED, epoch, True).tolist()
        # what was trained is the epoch's order up to a point: nothing skipped before it...
        assert set(ids) == set(order[: len(ids)]), f"epoch {epoch}: samples skipped mid-epoch"
        # ...and what is left is less than one step of the last shape plus what no rank's share could fill
        assert N - len(ids) < last_world * BATCH + last_world, f"epoch {epoch}: {N - len(ids)} samples never trained"


@pytest.mark.parametrize("kind", ["tensor", "dataloader"])
@pytest.mark.parametrize("saved", [1, 2, 3, 4])
@pytest.mark.parametrize("resumed", [1, 2, 3, 4])
def test_a_mid_epoch_state_of_s_ranks_resumes_on_r_ranks_every_sample_once(kind, saved, resumed):
    rng = random.Random(saved * 10 + resumed)
    stop = rng.randrange(1, N // (saved * BATCH))  # a random step inside the first epoch
    trained = train(kind, [saved, resumed], [stop], epochs=2)
    check_once(trained, 2)
    assert trained[1] == train(kind, [resumed], [], epochs=2)[1]  # the next epoch is whole, sharded anew


@pytest.mark.parametrize("seed", range(20))
def test_three_random_interruptions_on_random_shapes_train_every_sample_once(seed):
    rng = random.Random(seed)
    shapes = [rng.randint(1, 4) for _ in range(4)]
    stops = [rng.randint(1, 20) for _ in range(3)]
    kind = "tensor" if seed % 2 else "dataloader"
    trained = train(kind, shapes, stops, epochs=3)
    check_once(trained, 3)


def test_the_same_shape_resumes_exactly_where_an_uninterrupted_run_is():
    straight = train("tensor", [2], [], epochs=2)
    resumed = train("tensor", [2, 2, 2], [5, 9], epochs=2)
    assert resumed[0] == straight[0] and resumed[1] == straight[1]


def test_a_state_for_a_dataset_of_another_size_is_refused():
    loader = make("tensor", 0, 1)
    with pytest.raises(ConfigError, match="dataset of 50 samples; this one has 97"):
        loader.load_state_dict({"epoch": 0, "consumed": 10, "samples": 50})


def test_a_per_rank_batch_position_of_old_is_refused_not_read_as_the_epochs_start():
    loader = make("dataloader", 0, 2)
    with pytest.raises(ConfigError, match="batch position of some ranks"):
        loader.load_state_dict({"epoch": 1, "batch": 2})
