"""``ddp:comm_hook=shm``: CPU ranks on one node average their gradients through shared memory.

gloo all-reduces over TCP even when every rank is on the same node: each bucket is cut into pieces,
copied through the kernel's loopback sockets several times, and gloo's own threads do it while
backward computes on the same cores. On a node whose cores the ranks already fill, that is pure loss.
This hook does what oneCCL's and DeepSpeed's CPU back ends do on one node: every rank maps one shared
buffer, writes its bucket into its own slot, sums its share of the elements over all slots (a
reduce-scatter, each rank 1/N of the work), and copies the averaged result back — memory copies and
one pass of additions, no sockets, no extra threads.

Synchronisation is two barriers per bucket. Each barrier is a byte written to every other rank's named
pipe and read, with a timeout, from one's own: the waiting rank sleeps in the kernel instead of spinning
on cores the other ranks need, and the pipe's system calls order the memory accesses around it. The
buffer and the pipes are unlinked as soon as every rank has opened them, so nothing is left in
``/dev/shm`` whatever way the job ends.

The hook is synchronous: the bucket is averaged before backward goes on (there is no second set of
cores to overlap with here). DDP launches the buckets in the same order on every rank, which is what
makes the slot reuse safe: a bucket's second barrier is passed only when every rank has copied out the
previous result. Refused (a ConfigError naming the fix) for ranks on several nodes or off the CPU.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import tempfile
import time
import uuid
from typing import Any

import torch
import torch.distributed as dist

from trainscale.errors import ConfigError
from trainscale.observe import hooks
from trainscale.runtime.hangwatch import ledger

DEFAULT_TIMEOUT_S = 1800.0  # torch's default process-group timeout (30 min) for a rank that never arrives


class SharedMemoryUnavailable(ConfigError):
    """The ranks cannot share memory (several nodes, or separate /dev/shm); ``auto`` falls back to none."""


def group_timeout_s(process_group: Any = None) -> float:
    """The process group's collective timeout (``init(timeout_s=...)``, ``--timeout``), torch's default otherwise."""
    try:
        group = process_group or dist.group.WORLD
        return group._get_backend(torch.device("cpu")).options._timeout.total_seconds()
    except (AttributeError, RuntimeError, ValueError):
        return DEFAULT_TIMEOUT_S


class SharedMemoryAllReduce:
    """One node's shared buffer (a slot per rank plus a result area) and its pipe barrier."""

    def __init__(self, gradient_bytes: int, *, process_group: Any = None, hosts: set[str] | None = None) -> None:
        self.world = dist.get_world_size(process_group)
        self.rank = dist.get_rank(process_group)
        self.timeout_s = group_timeout_s(process_group)
        if hosts is None:  # the host names the ranks run on
            gathered: list[Any] = [None] * self.world
            dist.all_gather_object(gathered, socket.gethostname(), group=process_group)
            hosts = set(gathered)
        if len(hosts) > 1:
            raise SharedMemoryUnavailable(
                f"comm_hook=shm averages gradients through one node's shared memory, but the ranks run "
                f"on {len(hosts)} nodes ({', '.join(sorted(hosts)[:4])})",
                hint="comm_hook=none (DDP's all-reduce) for jobs on several nodes",
            )
        # every slot holds a whole bucket; a bucket is never larger than the gradient (rounded up to 64 bytes)
        self.slot = -(-max(gradient_bytes, 64) // 64) * 64
        size = self.slot * (self.world + 1)
        names: list[Any] = [None]
        if self.rank == 0:
            shm = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
            names[0] = os.path.join(shm, f"trainscale-shm-{uuid.uuid4().hex}")
            # 0600, whatever the umask: the gradients are this job's, not other users' of the node
            fd = os.open(names[0] + ".buf", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                os.ftruncate(fd, size)
            finally:
                os.close(fd)
        dist.broadcast_object_list(names, src=0, group=process_group)
        self.base = base = names[0]  # the buffer is base.buf, rank r's pipe base.r
        seen: list[Any] = [None] * self.world  # one host name, but maybe a container's own /dev/shm per rank
        dist.all_gather_object(seen, os.path.exists(base + ".buf"), group=process_group)
        if not all(seen):
            dist.barrier(group=process_group)
            if self.rank == 0:
                os.unlink(base + ".buf")
            blind = [r for r, ok in enumerate(seen) if not ok]
            raise SharedMemoryUnavailable(
                f"comm_hook=shm: rank(s) {blind[:8]} cannot see the shared buffer rank 0 made "
                f"in {os.path.dirname(base)} (a container with its own /dev/shm?)",
                hint="comm_hook=none, or share the host's /dev/shm with the container",
            )
        self.arena = torch.from_file(base + ".buf", shared=True, size=size, dtype=torch.uint8)
        self._pipes = [f"{base}.{r}" for r in range(self.world)]
        os.mkfifo(self._pipes[self.rank], 0o600)
        self._inbox = os.open(self._pipes[self.rank], os.O_RDWR | os.O_NONBLOCK)  # RDWR: never EOF, never blocks
        dist.barrier(group=process_group)
        self._outbox = {r: os.open(p, os.O_WRONLY | os.O_NONBLOCK) for r, p in enumerate(self._pipes) if r != self.rank}
        dist.barrier(group=process_group)
        os.unlink(self._pipes[self.rank])
        if self.rank == 0:
            os.unlink(base + ".buf")
        self._seen = [0] * self.world
        self._round = 0
        # The barrier rounds are this hook's collectives: a rank stuck before one has fewer, which is
        # how the guard names it (runtime/hangwatch/heartbeat.py); the gloo group never sees these.
        ledger.track(f"shm:{os.path.basename(base)}", self, process_group or dist.group.WORLD)

    @property
    def collectives(self) -> int:
        """Barriers entered so far (the same on every rank once each has passed them)."""
        return self._round

    def _barrier(self) -> None:
        """Every rank has reached its round ``self._round``. Each arrival is the sender's rank as one
        4-byte record: writes up to PIPE_BUF bytes are atomic, so the pipe only ever holds whole records
        and a read of a multiple of 4 bytes returns whole ones."""
        self._round += 1
        me = self.rank.to_bytes(4, "little")
        for fd in self._outbox.values():
            os.write(fd, me)
        deadline = time.monotonic() + self.timeout_s
        others = [r for r in range(self.world) if r != self.rank]
        while any(self._seen[r] < self._round for r in others):
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._inbox], [], [], left)[0]:
                late = [r for r in others if self._seen[r] < self._round]
                raise RuntimeError(
                    f"comm_hook=shm: timed out after {self.timeout_s:g}s waiting for rank(s) "
                    f"{', '.join(map(str, late))} at the gradient average"
                )
            try:
                data = os.read(self._inbox, 4096)
            except BlockingIOError:
                continue
            for k in range(0, len(data), 4):
                self._seen[int.from_bytes(data[k : k + 4], "little")] += 1

    def average(self, tensor: torch.Tensor) -> torch.Tensor:
        """Average ``tensor`` (a contiguous CPU bucket) over the ranks, in place; returns it."""
        flat = tensor.view(-1)
        n = flat.numel()
        nbytes = n * flat.element_size()
        if nbytes > self.slot:
            raise RuntimeError(f"comm_hook=shm: a bucket of {nbytes} bytes does not fit the {self.slot}-byte slot")
        view = self.arena[: self.slot * (self.world + 1)].view(self.world + 1, self.slot)
        slots = view[:, :nbytes].view(flat.dtype)  # (world + 1) x n: one row per rank, the last is the result
        slots[self.rank].copy_(flat)
        self._barrier()
        per = -(-n // self.world)
        lo, hi = min(self.rank * per, n), min((self.rank + 1) * per, n)
        if hi > lo:
            out = slots[self.world, lo:hi]
            torch.add(slots[0, lo:hi], slots[1, lo:hi], out=out)
            for r in range(2, self.world):
                out.add_(slots[r, lo:hi])
            out.div_(self.world)
        self._barrier()
        flat.copy_(slots[self.world])
        return tensor


def shm_hook(state: SharedMemoryAllReduce, bucket: Any) -> torch.futures.Future:
    """DDP communication hook: the bucket averaged through shared memory, returned as a done future. It holds
    backward up while it averages: the recorder (observe/hooks.py) counts that as exposed communication."""
    recorder = hooks.current()
    future: torch.futures.Future = torch.futures.Future()
    with recorder.blocking_collective() if recorder is not None else contextlib.nullcontext():
        future.set_result(state.average(bucket.buffer()))
    return future


def applies(device: torch.device, backend: Any, world_size: int) -> bool:
    """Where ``comm_hook=auto`` tries ``shm``: 2+ gloo ranks on the CPU (it still falls back to the
    backend's all-reduce when :class:`SharedMemoryAllReduce` finds the ranks cannot share memory)."""
    return device.type == "cpu" and "gloo" in str(backend) and world_size > 1


def check_device(device: torch.device) -> None:
    if device.type != "cpu":
        raise ConfigError(
            f"comm_hook=shm averages CPU gradients, but this run trains on {device.type}",
            hint="comm_hook=none (NCCL/RCCL already use the node's fastest path)",
        )
