"""A hung rank is named, with its Python stack, wherever it hangs: inside ``rt.guard`` (the README's
loop: forward, backward and optimizer inside it) or before it, with every DDP communication hook
(none, shm, bf16, fp16), on 2 and on 4 real gloo ranks.

One launch of the ranks runs the scenarios one after another, each on a process group of its own
(over a prefix of one store), so the matrix costs one start of the ranks, not one per scenario.
"""

from __future__ import annotations

import datetime

import pytest
from helpers.multiproc import run_on_ranks

TIMEOUT_S = 4.0
WAIT = datetime.timedelta(seconds=120)  # bounds on the ranks' own waits, so a failing test ends
HANG_STEP = 2


class Released(Exception):
    """The hung rank, let go once the others have named it, leaves its step."""


def stuck_inside_the_step(store, key: str) -> None:
    store.wait([key], WAIT)  # what the others' errors must show as the hung rank's stack
    raise Released


def stuck_before_the_step(store, key: str) -> None:
    store.wait([key], WAIT)
    raise Released


def run_scenarios(plan: list[tuple[str, str, int]]) -> list[str | None]:
    """For each (comm hook, where, hung rank): this rank's error message (None on the hung rank)."""
    import os

    import torch
    import torch.distributed as dist
    from torch import nn

    import trainscale
    from trainscale.runtime.hangwatch.watch import CollectiveTimeout

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    base = dist.TCPStore("127.0.0.1", int(os.environ["MASTER_PORT"]), world, is_master=rank == 0, timeout=WAIT)
    found: list[str | None] = []
    for k, (hook, where, hung) in enumerate(plan):
        dist.init_process_group(
            "gloo",
            store=dist.PrefixStore(f"scenario{k}", base),
            rank=rank,
            world_size=world,
            timeout=datetime.timedelta(seconds=TIMEOUT_S),
        )
        rt = trainscale.init(timeout_s=TIMEOUT_S, set_threads=False)  # adopts the group
        rt.on_collective_timeout(lambda error: 1 / 0)  # a broken callback must not hide the diagnosis
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
        # Every rank at the start line through the store's long wait: on a loaded machine one rank may start
        # seconds after another, and the short timeout is for the hang, not for a late start.
        base.set(f"ready/{k}/{rank}", "1")
        base.wait([f"ready/{k}/{r}" for r in range(world)], WAIT)
        model, opt = rt.setup(model, torch.optim.SGD(model.parameters(), lr=0.1), strategy=f"ddp:comm_hook={hook}")
        release = f"release/{k}"
        message = None
        try:
            for step in range(HANG_STEP + 2):
                x = torch.randn(4, 8)
                if rank == hung and step == HANG_STEP and where == "before":
                    stuck_before_the_step(base, release)
                with rt.guard(step):
                    loss = nn.functional.cross_entropy(model(x), (x.sum(1) > 0).long())
                    if rank == hung and step == HANG_STEP and where == "inside":
                        stuck_inside_the_step(base, release)
                    rt.backward(loss)
                    opt.step()
                    opt.zero_grad()
        except Released:
            pass
        except CollectiveTimeout as exc:
            message = str(exc)
        except Exception as exc:  # any other error is what the test reports
            message = f"not a CollectiveTimeout: {type(exc).__name__}: {exc}"
        if rank != hung:
            # Every waiting rank has given up before the hung one is let go (its return would close
            # connections the others may still wait on).
            base.set(f"done/{k}/{rank}", "1")
            base.wait([f"done/{k}/{r}" for r in range(world) if r != hung], WAIT)
            base.set(release, "1")
        found.append(message)
        del model, opt
        rt.close()
        dist.destroy_process_group()
        base.set(f"closed/{k}/{rank}", "1")
        base.wait([f"closed/{k}/{r}" for r in range(world)], WAIT)
    # rank 0 hosts the store: it returns (and its process takes the store down) only after every other rank's
    # last request, else a rank still waiting on the barrier above loses its connection on a loaded machine
    if rank == 0:
        base.wait([f"left/{r}" for r in range(1, world)], WAIT)
    else:
        base.set(f"left/{rank}", "1")
    return found


def _check(results: dict[int, list], plan: list[tuple[str, str, int]]) -> None:
    for k, (hook, where, hung) in enumerate(plan):
        stack = f"in stuck_{where}_the_step"
        for rank, messages in results.items():
            message = messages[k]
            if rank == hung:
                assert message is None, (hook, where, message)
                continue
            assert message and f"rank(s) {hung} did not arrive" in message, (hook, where, rank, message)
            assert f"rank {hung}'s Python stack" in message and stack in message, (hook, where, rank, message)


# (comm hook, where the rank hangs, which rank): every hook inside the step on one size or both, a hang
# before the step on each, rank 0 (which hosts the store) among the hung.
FOUR = [("none", "inside", 3), ("shm", "inside", 1), ("bf16", "inside", 0), ("fp16", "before", 2)]
TWO = [("none", "before", 1), ("shm", "inside", 0), ("bf16", "inside", 1), ("fp16", "inside", 0)]


@pytest.mark.slow
def test_a_rank_hung_inside_or_before_the_step_is_named_with_its_stack_on_four_ranks():
    _check(run_on_ranks(run_scenarios, 4, FOUR, timeout=300), FOUR)


@pytest.mark.slow
def test_a_rank_hung_inside_or_before_the_step_is_named_with_its_stack_on_two_ranks():
    _check(run_on_ranks(run_scenarios, 2, TWO, timeout=300), TWO)
