"""The Runtime on real gloo ranks: collectives, rank-zero-first ordering, teardown on error."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from helpers.multiproc import run_on_ranks


def collectives() -> tuple:
    import trainscale

    with trainscale.init() as rt:
        return rt.rank, rt.world_size, rt.backend, str(rt.device), rt.mean(float(rt.rank)), rt.sum(1.0)


def test_collectives_on_three_ranks():
    results = run_on_ranks(collectives, 3)
    for rank, (r, world, backend, device, mean, total) in results.items():
        assert (r, world, backend, device) == (rank, 3, "gloo", "cpu")
        assert mean == pytest.approx(1.0) and total == 3.0


def first_writer(directory: str, local: bool) -> tuple[int, float, float]:
    import trainscale

    with trainscale.init() as rt:
        with rt.rank_zero_first(local=local):
            marker = Path(directory) / "data.ready"
            if rt.is_local_main if local else rt.is_main:
                time.sleep(0.3)  # a slow download: the others must still wait for it
                marker.write_text("ok")
            entered_after_marker = marker.exists()
            when = time.time()
        return rt.rank, float(entered_after_marker), when


@pytest.mark.parametrize("local", [False, True])
def test_rank_zero_first_makes_the_others_wait(tmp_path, local):
    results = run_on_ranks(first_writer, 3, str(tmp_path), local)
    assert all(entered for _, entered, _ in results.values())
    assert results[0][2] <= min(results[r][2] for r in (1, 2))


def raises_inside() -> bool:
    import torch.distributed as dist

    import trainscale

    try:
        with trainscale.init() as rt:
            rt.barrier()  # every rank joined: one that raised at once could close its end of gloo's mesh
            raise KeyError("boom")  # while a slower peer was still connecting (a failed init, not this test)
    except KeyError:
        pass
    return dist.is_initialized()


def test_process_group_is_destroyed_when_the_body_raises():
    assert run_on_ranks(raises_inside, 2) == {0: False, 1: False}


def srun_style() -> tuple:
    """A task started by srun without torchrun: only SLURM variables, trainscale finds the rest."""
    import trainscale

    with trainscale.init() as rt:
        return rt.env.source, rt.rank, rt.local_rank, rt.node_rank, rt.world_size, rt.mean(float(rt.rank))


def test_srun_style_launch_from_slurm_variables_only():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    base = {
        "SLURM_JOB_ID": "77",
        "SLURM_STEP_ID": "0",
        "SLURM_NTASKS": "2",
        "SLURM_TASKS_PER_NODE": "1(x2)",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_NNODES": "2",
        "MASTER_PORT": str(port),
    }
    # run_on_ranks sets torchrun variables; remove them so only SLURM's remain in each rank
    results = run_on_ranks(srun_style_wrapper, 2, base)
    assert results == {0: ("slurm", 0, 0, 0, 2, 0.5), 1: ("slurm", 1, 0, 1, 2, 0.5)}


def srun_style_wrapper(base: dict) -> tuple:
    rank = os.environ["RANK"]
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR"):
        os.environ.pop(key, None)
    os.environ.update(base)
    os.environ.update({"SLURM_PROCID": rank, "SLURM_LOCALID": "0", "SLURM_NODEID": rank})
    return srun_style()


def frees_its_model_after_close(peer_may_finish, peer_finished) -> str:
    """A DDP model that outlives the close, freed while a gloo worker still holds a collective's Python tensor."""
    import gc

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    import trainscale

    with trainscale.init() as rt:
        model = DDP(torch.nn.Linear(2, 2))
        model(torch.ones(1, 2)).sum().backward()
        group = dist.group.WORLD
    if rt.rank == 1:
        # The tensor's Python object is dropped at once; gloo's worker keeps the tensor until rank 0 joins
        # in, then needs the GIL to drop that object too.
        group.allreduce([torch.ones(1)])
        del group
        peer_may_finish.set()
        del model  # if the Reducer held the group's last reference: ~ProcessGroupGloo joins that worker here
        gc.collect()
        peer_finished.wait()  # rank 0's half of the all-reduce is read before this process's sockets close
        return "freed"
    peer_may_finish.wait()
    group.allreduce([torch.ones(1)]).wait()
    peer_finished.set()
    return "freed"


def test_a_model_freed_after_close_does_not_deadlock_in_gloo_teardown():
    # Ranks fork from the forkserver, as trainscale's own workers do: it imported torch._dynamo before any
    # group existed (imported later, it keeps references to the group, hiding this deadlock).
    import multiprocessing

    ctx = multiprocessing.get_context("forkserver")
    assert run_on_ranks(frees_its_model_after_close, 2, ctx.Event(), ctx.Event(), timeout=60) == {
        0: "freed",
        1: "freed",
    }
