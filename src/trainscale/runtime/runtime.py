"""The Runtime: this rank's place in the job, its device and process group, and the helpers around them.

Stripped of detection and safety, this is the familiar DDP preamble:

    dist.init_process_group(backend, rank=rank, world_size=world_size)
    torch.cuda.set_device(local_rank)
    ...
    dist.destroy_process_group()
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import gc
import os
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from trainscale.env import LaunchEnv, detect
from trainscale.errors import ConfigError, record_error
from trainscale.runtime import nccl, store
from trainscale.runtime.determinism import enable_determinism
from trainscale.runtime.device import pick_backend, pick_device
from trainscale.runtime.hangwatch import heartbeat as progress
from trainscale.runtime.preemption import Preemption
from trainscale.runtime.seed import seed_everything
from trainscale.runtime.threads import apply_thread_count

# The process groups the last clean close destroyed, still referenced here until the next close or exit. A
# DDP model outlives the close (a script returns it, or holds it), and its C++ Reducer keeps the group alive;
# if the Reducer held the last reference, freeing the model would run ~ProcessGroupGloo under the GIL, which
# joins gloo's worker threads while one may still need the GIL to drop a finished collective's Python
# tensors: a deadlock (docs/launch.md). torch's binding drops a reference of ours with the GIL released.
_RETIRED_GROUPS: list[Any] = []


def _retire(groups: Any) -> None:
    # The previous close's groups go now: their workers have had the GIL since (this close's barrier
    # released it), so they are idle.
    _RETIRED_GROUPS[:] = list(groups)
    atexit.unregister(_release_retired_groups)  # registered once
    atexit.register(_release_retired_groups)


def _release_retired_groups() -> None:
    if _RETIRED_GROUPS:
        gc.collect()  # models in reference cycles go first: the references dropped next are then the last
        _RETIRED_GROUPS.clear()


@dataclass(kw_only=True)
class Runtime:
    """What a training script needs to know about its rank. Returned by :func:`init`."""

    env: LaunchEnv
    device: torch.device
    backend: str | None
    seed: int
    timeout: datetime.timedelta
    owns_process_group: bool = False
    notes: list[str] = field(default_factory=list)
    timeout_callbacks: list[Callable[[Exception], None]] = field(default_factory=list)
    """Called with the CollectiveTimeout on the rank that detects a hang, before it ends (see
    :meth:`on_collective_timeout`)."""
    _closed: bool = False
    _progress: Any = None
    _preemption: Any = None

    # -- where am I (the launch environment's fields) -------------------------------------------
    rank = property(lambda self: self.env.rank)
    local_rank = property(lambda self: self.env.local_rank)
    world_size = property(lambda self: self.env.world_size)
    local_world_size = property(lambda self: self.env.local_world_size)
    node_rank = property(lambda self: self.env.node_rank)
    num_nodes = property(lambda self: self.env.num_nodes)
    restart_count = property(lambda self: self.env.restart_count)
    attempt = property(
        lambda self: self.env.attempt, doc="0 on the first run; counts SLURM requeues and torchrun restarts."
    )

    @property
    def is_main(self) -> bool:
        return self.env.rank == 0

    @property
    def is_local_main(self) -> bool:
        return self.env.local_rank == 0

    @property
    def is_distributed(self) -> bool:
        return self.env.world_size > 1 and dist.is_available() and dist.is_initialized()

    @property
    def uses_nccl(self) -> bool:
        """True for ``nccl`` and for the mixed ``cpu:gloo,cuda:nccl`` group (its GPU tensors go to NCCL)."""
        return "nccl" in (self.backend or "")

    # -- collectives and helpers ----------------------------------------------------------------
    def barrier(self) -> None:
        if self.is_distributed:
            if self.uses_nccl:
                dist.barrier(device_ids=[self.device.index])
            else:
                dist.barrier()

    def synchronize(self) -> None:
        """Wait until this rank's device has finished the work queued so far (a no-op on the CPU).

        CUDA runs asynchronously: a wall-clock time read without this measures how fast work was
        queued, not done."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def on_collective_timeout(self, callback: Callable[[Exception], None]) -> None:
        """Call ``callback(error)`` when this rank turns a hang into a CollectiveTimeout (inside
        :meth:`guard`, or from the watching heartbeat on NCCL, just before it ends the process):
        the place to flush your own logs or metrics."""
        self.timeout_callbacks.append(callback)

    def print(self, *args, all_ranks: bool = False, **kwargs) -> None:
        """print() on rank 0 only (or on every rank, prefixed with its rank)."""
        if all_ranks:
            print(f"[rank {self.rank}]", *args, **kwargs, flush=True)
        elif self.is_main:
            print(*args, **kwargs, flush=True)

    def mean(self, value: float | torch.Tensor) -> float:
        """The mean of a scalar metric over all ranks (every rank gets the same number)."""
        return self.means([value])[0]

    def means(self, values: Sequence[float | torch.Tensor]) -> list[float]:
        """:meth:`mean` of several scalars in one all-reduce."""
        return self._all_reduce(values, mean=True)

    def sum(self, value: float | torch.Tensor) -> float:
        """The sum of a scalar over all ranks (totals, counts: exact where a mean times N would round)."""
        return self._all_reduce([value], mean=False)[0]

    def _all_reduce(self, values: Sequence[float | torch.Tensor], *, mean: bool) -> list[float]:
        dtype = torch.float32 if self.uses_nccl else torch.float64
        tensor = torch.stack([torch.as_tensor(v, dtype=dtype).detach().to(self.device).reshape(()) for v in values])
        if self.is_distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
            if mean:
                tensor /= self.world_size
        return tensor.tolist()

    @contextlib.contextmanager
    def rank_zero_first(self, local: bool = False) -> Iterator[None]:
        """Run the body on rank 0 first (download, unpack, mkdir) while the others wait, then on the rest.

        ``local=True`` does it once per node (local rank 0), for data on node-local disks.
        """
        first = self.is_local_main if local else self.is_main
        if not first:
            self.barrier()
        try:
            yield
        finally:
            if first:
                self.barrier()

    @contextlib.contextmanager
    def guard(self, step: int, op: str = "training step (gradient all-reduce)") -> Iterator[None]:
        """Wrap one training step: records progress, and turns a collective timeout into an error
        naming the rank(s) that hold the others up — stopped before this step or inside it — with
        their Python stacks (see runtime/hangwatch/heartbeat.py; a script that never calls it gets the same from the
        worker
        bootstrap's heartbeat)."""
        if self._progress is None:
            self._progress = progress.for_runtime(self)
        self._progress.mark(step, op)
        try:
            yield
        except Exception as exc:
            explained = self._progress.watcher.explain(exc)
            if explained is None:
                raise
            from trainscale.runtime.hangwatch.watch import call_timeout_callbacks  # noqa: PLC0415 (optional dependency)

            call_timeout_callbacks(self.timeout_callbacks, explained)
            if explained is exc:
                raise
            raise explained from exc

    def handle_preemption(self):
        """From now on SLURM's warning signal (SIGUSR1, or TRAINSCALE_PREEMPT_SIGNALS) only sets a flag:
        ``pre = rt.handle_preemption()`` once, then ``if pre.requested(): save, pre.requeue_and_log(...)``
        at step boundaries. The previous handlers come back in :meth:`close`."""
        if self._preemption is None:
            self._preemption = Preemption(self)
        return self._preemption

    @property
    def preemption(self):
        """The Preemption installed by :meth:`handle_preemption`, or None (reading this changes nothing)."""
        return self._preemption

    # -- teardown -------------------------------------------------------------------------------
    def close(self, synchronize: bool = True) -> None:
        """Destroy the process group trainscale created. Safe to call twice; the one teardown path.

        After a clean run every rank first meets in a barrier: rank 0 may host the store (srun and
        MPI launches), and leaving while a peer still talks to it aborts that peer. After an error
        no barrier is attempted (the peers may be gone).
        """
        if self._closed:
            return
        self._closed = True
        if self._preemption is not None:
            self._preemption.restore()
        if self._progress is not None:
            self._progress.close()
        if self.owns_process_group and dist.is_available() and dist.is_initialized():
            try:
                if synchronize:
                    self.barrier()
            finally:
                if synchronize:
                    _retire(dist.distributed_c10d._world.pg_map)
                dist.destroy_process_group()
                # Hands the GIL to a gloo worker still dropping a finished collective (it needs the
                # GIL for Python-made tensors) before the interpreter can shut down under it:
                # see release_process_groups in launch/bootstrap.py.
                gc.collect()

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None:  # before the group closes: the peers fail as soon as it does, and the launcher
            record_error(exc)  # names the rank whose error file holds a cause of its own
        self.close(synchronize=exc_type is None)

    def describe(self) -> str:
        return (
            f"rank {self.rank}/{self.world_size} (local {self.local_rank}/{self.local_world_size}, "
            f"node {self.node_rank}/{self.num_nodes}) via {self.env.source}, device {self.device}, "
            f"backend {self.backend or 'none'}"
        )


def init(
    *,
    device: str = "auto",
    backend: str | None = None,
    seed: int = 0,
    timeout_s: float = 1800.0,
    set_threads: bool = True,
    deterministic: bool = False,
    environ: dict[str, str] | None = None,
) -> Runtime:
    """Detect the launch, pick the device and backend, start the process group and seed every RNG.

    Works unchanged for one process (no process group) and for N ranks from torchrun, srun or mpirun.
    ``deterministic``: bitwise-repeatable GPU runs (runtime/determinism.py, docs/gpu.md).
    """
    if not 0 < timeout_s < 2**31 / 1000:  # nan and inf fail this too; torch keeps it in int32 milliseconds
        raise ConfigError(
            f"timeout_s={timeout_s} must be a number of seconds > 0 and below 2147483",
            hint="give the collective timeout in seconds, e.g. 600",
        )
    if not 0 <= seed < 2**63:
        raise ConfigError(f"seed={seed} is outside 0 ... 2**63 - 1 (torch's seeds are 64-bit)", hint="e.g. seed=0")
    environ = os.environ if environ is None else environ
    env = detect(environ)
    notes: list[str] = []
    if deterministic:  # before anything touches cuBLAS
        notes += enable_determinism()
    dev = pick_device(env, device, environ=environ)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)  # before the process group, so NCCL binds the right GPU
    if set_threads and dev.type == "cpu":
        _, reason = apply_thread_count(env.local_world_size)
        if reason:
            notes.append(reason)
    chosen_backend = None
    owns = False
    timeout = datetime.timedelta(seconds=timeout_s)
    if env.world_size > 1:
        chosen_backend = pick_backend(dev, backend)
        if dist.is_initialized():
            chosen_backend = dist.get_backend()
        else:
            _init_process_group(env, chosen_backend, dev, timeout)
            owns = True
    seed_everything(seed)
    runtime = Runtime(
        env=env, device=dev, backend=chosen_backend, seed=seed, timeout=timeout, owns_process_group=owns, notes=notes
    )
    if runtime.is_main:
        for note in notes:
            print(f"trainscale: {note}", file=sys.stderr, flush=True)
    return runtime


def _init_process_group(env: LaunchEnv, backend: str, dev: torch.device, timeout: datetime.timedelta) -> None:
    kwargs: dict = {}
    group_timeout = timeout
    if "nccl" in backend:
        nccl.enable_flight_recorder(job_dir=env.job_dir)
        if os.environ.get(nccl.EXPECTED_NETWORK_VAR) and env.num_nodes > 1:  # which network NCCL picks, to a file
            nccl.transport_log(
                os.environ, os.path.join(env.run_dir or env.job_dir or tempfile.gettempdir(), "nccl-debug")
            )
        group_timeout = nccl.watchdog_timeout(timeout)  # the progress monitor names the hung rank first
    if dev.type == "cuda" and nccl.eager_init_is_safe(torch.__version__):
        kwargs["device_id"] = dev  # eager NCCL init bound to this GPU
    if env.source == "torchrun" and env.agent_store:
        # The elastic agent hosts the store: connect to it the way torch does (env://).
        kwargs["init_method"] = "env://"
    else:
        # Rank 0 hosts the store itself; build it bound to the master address only (runtime/store.py)
        # instead of letting torch listen on every address of the host.

        if env.rank == 0:
            kwargs["store"] = store.bound_server(env.master_addr, env.master_port, timeout)
        else:
            kwargs["store"] = store.client(env.master_addr, env.master_port, timeout)
    try:
        dist.init_process_group(
            backend=backend, rank=env.rank, world_size=env.world_size, timeout=group_timeout, **kwargs
        )
    except Exception as exc:
        explained = nccl.explain_init_error(exc)
        if explained is None:
            raise
        raise explained from exc
