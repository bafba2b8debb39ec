"""The shared-memory gradient average's buffer and pipes are private to the job's user (0600), whatever
the umask: other users of the node cannot read the gradients or write into the barrier (issue 20, item 6)."""

from __future__ import annotations

import os
import stat

import torch.distributed as dist

from trainscale.strategies.shm_allreduce import SharedMemoryAllReduce


def test_the_buffer_and_pipes_are_created_0600_under_a_permissive_umask(monkeypatch):
    modes = {}
    unlink = os.unlink

    def seen_then_unlinked(path, *args, **kwargs):  # both are unlinked once every rank has opened them
        modes[os.path.basename(path).rsplit(".", 1)[-1]] = stat.S_IMODE(os.stat(path).st_mode)
        return unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", seen_then_unlinked)
    old = os.umask(0o022)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        SharedMemoryAllReduce(1024, hosts={"here"})
    finally:
        dist.destroy_process_group()
        os.umask(old)
    assert modes == {"buf": 0o600, "0": 0o600}, {k: oct(v) for k, v in modes.items()}
