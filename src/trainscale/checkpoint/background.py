"""Checkpoints saved in the background: training waits while the state is *staged* (copied into host
memory), a worker thread then writes it, makes it durable and renames it into place.

- At most one save is in flight. The next save, the end of a run and a preemption wait for it first,
  on every rank, and a save that failed in the background fails the run there, on every rank.
- What becomes visible is unchanged: a background save writes the same temporary file or partial
  directory as a synchronous one and renames it into place last (layout.py), so a process killed
  mid-save leaves the previous checkpoint the newest.
- Staging is torch's own (``torch.distributed.checkpoint.staging.DefaultStager``): a host copy of every
  tensor, kept between saves and refilled by the next one, so the copy costs host memory for one
  checkpoint's worth of state (on rank 0 for a rank-0 file; each rank's shards for a sharded one).
- Sharded (DCP) saves go through ``torch.distributed.checkpoint.async_save``, whose background part
  plans and gathers over a process group of its own (gloo), never over the training's collectives.
- Where the state cannot be staged (a strategy's ``native`` files: DeepSpeed's engine writes them
  itself), saves stay synchronous; asking for background saves there is refused (``Storage.resolve_async``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from trainscale.errors import CheckpointError

HOLD = "TRAINSCALE_CHECKPOINT_HOLD"
"""A test hook, ``STEP:FIFO``: the background save of STEP stops just before it would become visible
(its temporary file or partial directory written), writes ``"PID STEP"`` into the named pipe FIFO and
waits forever, so that a test can kill the process while the save is in flight."""


def stager(device: torch.device | None = None) -> Any:
    """torch's stager for background saves: synchronous copies into host memory it keeps and reuses;
    pinned when the state lives on a GPU (faster copies back)."""
    pinned = device is not None and device.type == "cuda"
    return DefaultStager(
        StagingOptions(
            use_pinned_memory=pinned, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=False
        )
    )


def hold_point(step: int) -> None:
    """The test hook :data:`HOLD` (a no-op unless the variable names this step)."""
    spec = os.environ.get(HOLD)
    if not spec:
        return
    at, _, fifo = spec.partition(":")
    if int(at) != step:
        return
    with open(fifo, "w") as pipe:  # blocks until the test opens the other end
        pipe.write(f"{os.getpid()} {step}\n")
    threading.Event().wait()


@dataclass(frozen=True)
class _Save:
    step: int
    path: Path
    future: Future


class InFlight:
    """The one background save a Checkpointer may have running, on one worker thread.

    The worker is not a daemon: a process that ends normally (an exception included) finishes the save
    in flight before it exits; one that is killed leaves it incomplete and invisible."""

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._save: _Save | None = None

    @property
    def busy(self) -> bool:
        return self._save is not None

    def start(self, step: int, path: Path, job: Callable[[], None]) -> None:
        """Run ``job`` (the rest of the save of ``step`` to ``path``) in the background. One at a time:
        :meth:`wait` for the previous one first."""
        if self._save is not None:
            raise RuntimeError(
                f"the save of step {self._save.step} is still in flight: wait() for it before "
                f"starting the save of step {step}"
            )
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainscale-checkpoint")
        self._save = _Save(step, Path(path), self._executor.submit(job))

    def wait(self) -> CheckpointError | None:
        """Block until the save in flight (if any) is complete; its failure, as a CheckpointError that
        names the path and the fix, is returned rather than raised (the caller tells the other ranks)."""
        save, self._save = self._save, None
        if save is None:
            return None
        error = save.future.exception()  # blocks until the worker is done
        if error is None:
            return None
        what = error.message if isinstance(error, CheckpointError) else f"{type(error).__name__}: {error}"
        own_hint = getattr(error, "hint", None) if isinstance(error, CheckpointError) else None
        failed = CheckpointError(
            f"the background save of step {save.step} to {save.path} failed: {what}",
            hint=(
                f"{own_hint}; or save in the training's own time with --no-checkpoint-async"
                if own_hint
                else f"the newest complete checkpoint in {save.path.parent} stays the one to resume from; check free "
                "space and permissions there, or save in the training's own time with --no-checkpoint-async"
            ),
        )
        failed.__cause__ = error
        return failed

    def close(self) -> None:
        """Finish the save in flight (its failure is not reported: call :meth:`wait` for that) and
        stop the worker."""
        self._save = None
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None


def failed_ranks(runtime: Any, failed: bool) -> list[int]:
    """Every rank: the ranks whose background save failed (one small all-reduce; also a barrier)."""
    if not getattr(runtime, "is_distributed", False):
        return [runtime.rank] if failed else []

    flags = torch.zeros(runtime.world_size, device=runtime.device)
    flags[runtime.rank] = float(failed)
    dist.all_reduce(flags)
    return [rank for rank, flag in enumerate(flags.tolist()) if flag]


def checkpoint_group(runtime: Any) -> Any:
    """A process group of its own for DCP's background planning (every rank calls this, once): gloo,
    so that the background thread's collectives never interleave with the training's on the default
    group (torch's async_save needs a CPU backend for them anyway). Described ``trainscale-checkpoint``: its
    collectives run on each rank's writer thread at that rank's own pace, and the hang watch leaves them out
    (runtime/hangwatch/ledger.py)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    timeout = getattr(runtime, "timeout", None)
    return dist.new_group(
        backend="gloo", group_desc="trainscale-checkpoint", **({"timeout": timeout} if timeout is not None else {})
    )
