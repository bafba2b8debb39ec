"""``ddp:comm_hook=shm`` (and ``auto``, which picks it for CPU ranks on one node) on real gloo ranks.

- The shared-memory average equals gloo's all-reduce average: bitwise for 2 ranks (a/2 + b/2 and
  (a + b)/2 round alike), within float rounding for 3; odd sizes, half precision and successive buckets
  of different sizes included; nothing is left in /dev/shm.
- A rank that never arrives: the others stop after the process group's timeout, with "timed out".
- Ranks on two hosts (one rank told another host name): a ConfigError naming comm_hook=none, and auto
  falls back to DDP's all-reduce.
- DDP training with the hook gives the parameters of DDP's own all-reduce.
"""

from __future__ import annotations

import glob
import socket

import pytest
import torch
from helpers.multiproc import run_on_ranks


def averages() -> tuple[str, list[tuple[torch.Tensor, torch.Tensor]]]:
    import torch.distributed as dist

    import trainscale
    from trainscale.strategies.shm_allreduce import SharedMemoryAllReduce

    with trainscale.init(seed=0, set_threads=False) as rt:
        shm = SharedMemoryAllReduce(4 * 10_007)
        out = []
        g = torch.Generator().manual_seed(rt.rank)
        for n, dtype in ((10_007, torch.float32), (5, torch.float32), (3_001, torch.bfloat16), (1, torch.float32)):
            x = torch.randn(n, generator=g).to(dtype)
            mine = shm.average(x.clone())
            theirs = x.clone()
            dist.all_reduce(theirs)
            out.append((mine, theirs / rt.world_size))
        return shm.base, out


@pytest.mark.parametrize("world", [2, 3])
def test_shared_memory_average_equals_gloos(world):
    results = run_on_ranks(averages, world, timeout=120)
    bases = {base for base, _ in results.values()}
    results = {rank: pairs for rank, (_, pairs) in results.items()}
    assert len(bases) == 1  # one buffer for the node
    for rank, pairs in results.items():
        for mine, theirs in pairs:
            if world == 2:
                assert torch.equal(mine, theirs), rank
            else:
                tolerance = 1e-6 if mine.dtype == torch.float32 else 1e-2
                assert torch.allclose(mine.float(), theirs.float(), rtol=tolerance, atol=tolerance), (rank, mine.dtype)
        for (mine, _), (other, _) in zip(pairs, results[0]):
            assert torch.equal(mine, other)  # every rank holds the same average
    # buffer and pipes unlinked (only this test's: other tests' DDP ranks may hold theirs now)
    assert glob.glob(glob.escape(bases.pop()) + "*") == []


def one_rank_never_arrives() -> str:
    import datetime

    import torch.distributed as dist

    import trainscale
    from trainscale.strategies.shm_allreduce import SharedMemoryAllReduce

    with trainscale.init(seed=0, set_threads=False, timeout_s=2) as rt:
        shm = SharedMemoryAllReduce(64)
        store = dist.distributed_c10d._get_default_store()
        if rt.rank == 1:  # stays away from the average, but alive until rank 0 has given up on it
            store.wait(["rank0-done"], datetime.timedelta(seconds=50))
            return "stayed away"
        try:
            shm.average(torch.ones(4))
            said = "averaged alone"
        except RuntimeError as exc:
            said = str(exc)
        store.set("rank0-done", "1")
        return said


def test_a_missing_rank_times_out_after_the_groups_timeout():
    results = run_on_ranks(one_rank_never_arrives, 2, timeout=60)
    assert "timed out after 2s waiting for rank(s) 1 at the gradient average" in results[0], results[0]


def two_hosts() -> tuple[str, str | None]:
    from torch import nn

    import trainscale
    from trainscale.errors import ConfigError
    from trainscale.strategies import comm_hooks, get_strategy
    from trainscale.strategies.base import OptimizerSpec
    from trainscale.strategies.shm_allreduce import SharedMemoryAllReduce

    real = socket.gethostname
    with trainscale.init(seed=0, set_threads=False) as rt:
        if rt.rank == 1:
            socket.gethostname = lambda: real() + "-other"  # as if rank 1 ran on another node
        try:
            SharedMemoryAllReduce(64)
            refused = "accepted"
        except ConfigError as exc:
            refused = f"{exc} {exc.hint}"
        net, _ = get_strategy("ddp").wrap(nn.Linear(4, 2), OptimizerSpec(torch.optim.SGD, {"lr": 0.1}), rt)
        hook = comm_hooks.attached(net)
        socket.gethostname = real
        return refused, hook.name if hook else None


def test_ranks_on_two_hosts_are_refused_and_auto_falls_back():
    refused, auto = run_on_ranks(two_hosts, 2, timeout=60)[0]
    assert "the ranks run on 2 nodes" in refused and "comm_hook=none" in refused
    assert auto is None  # DDP's built-in all-reduce: no hook registered


def train(rt, spec: str) -> tuple[dict[str, torch.Tensor], str | None, dict | None]:
    import os
    import tempfile

    from torch import nn

    from trainscale.observe import hooks
    from trainscale.observe.reading import ranks
    from trainscale.strategies import comm_hooks, get_strategy
    from trainscale.strategies.base import OptimizerSpec

    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 256), nn.Tanh(), nn.Linear(256, 4))
    strategy = get_strategy(spec).with_batch(8, 1)
    net, opt = strategy.wrap(net, OptimizerSpec(torch.optim.Adam, {"lr": 1e-2}), rt)
    with tempfile.TemporaryDirectory() as run_dir:  # the process's recorder, as the worker bootstrap installs it
        recorder = hooks.install(
            run_dir, environ={**os.environ, "TRAINSCALE_SAMPLE_INTERVAL": "0", "TRAINSCALE_STRAGGLER_EVERY": "0"}
        )
        g = torch.Generator().manual_seed(rt.rank)
        for _ in range(4):
            x, y = torch.randn(8, 256, generator=g), torch.randint(0, 4, (8,), generator=g)
            strategy.backward_loss(nn.functional.cross_entropy(net(x), y), net)
            strategy.micro_step(opt, net, last=True)
        recorder.finish()
        shares = next(s.shares for s in ranks(run_dir) if s.rank == rt.rank)
    hook = comm_hooks.attached(net)
    return (
        {k: v.detach().clone() for k, v in strategy.unwrap(net).state_dict().items()},
        hook.name if hook else None,
        shares,
    )


def training_runs() -> dict:
    import trainscale

    with trainscale.init(seed=0, set_threads=False) as rt:
        return {spec: train(rt, spec) for spec in ("ddp", "ddp:comm_hook=shm,bucket_cap_mb=1", "ddp:comm_hook=none")}


def test_ddp_with_the_shared_memory_hook_trains_like_ddps_all_reduce():
    results = run_on_ranks(training_runs, 2, timeout=120)
    r0, r1 = results[0], results[1]
    gloo = r0["ddp:comm_hook=none"][0]
    for spec in ("ddp", "ddp:comm_hook=shm,bucket_cap_mb=1"):
        params, name, summary = r0[spec]
        assert name == "shm", spec  # auto picks it: CPU ranks on one node
        assert all(torch.equal(params[k], gloo[k]) for k in gloo), spec
        assert all(torch.equal(params[k], r1[spec][0][k]) for k in params), spec
        # the hook holds backward up while it averages: the recorder counts that as exposed communication
        assert summary["comm"] > 0 and summary["backward"] > 0, spec
    assert r0["ddp:comm_hook=none"][1] is None and r0["ddp:comm_hook=none"][2]["comm"] > 0  # DDP's own all-reduce
