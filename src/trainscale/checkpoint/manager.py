"""Save on rank 0 (or on every rank, sharded), resume everywhere: model, optimizer, scheduler, loop
counters, RNG and loader state, kept to the newest ``keep`` checkpoints.

The newest checkpoint that verifies and loads wins; an incomplete, corrupt or refused one is
skipped with one warning naming the file, and every rank resumes from the same one (find_latest).
What is saved is a mapping of entries (checkpoint/state.py); where it goes is layout.py's business;
saving in the background (``asynchronous``) is background.py's; whether a checkpoint is intact,
integrity.py's.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainscale._version import __version__
from trainscale.checkpoint import background, disk, files, integrity, layout, lock, sharded
from trainscale.checkpoint.dcp_io import UnreadableShards
from trainscale.checkpoint.state import FILE, ModelState, Stateful
from trainscale.errors import CheckpointError

log = logging.getLogger("trainscale.checkpoint")

PORTABLE = {"ddp", "zero1", "fsdp"}
"""Strategies that resume each other's checkpoints (strategies/portable.py): ddp's and zero1's rank-0 files hold
the whole model and optimizer state in torch's own form, fsdp's DCP shards are read into any layout. DeepSpeed's
own files resume under each of them too (its ZeRO partitions merged), not the other way round."""


@dataclass(frozen=True)
class Found:
    """A complete checkpoint: where, which step, and what it holds."""

    path: Path
    step: int
    contents: dict[str, Any]
    """Everything saved except sharded model/optimizer state, with the record under ``"trainscale"``."""
    shards: sharded.ShardedRef | None = None
    """A sharded checkpoint's model/optimizer part, still on disk (None for a rank-0 file)."""
    verified: integrity.Verified | None = None
    """What checking it against its manifest cost on this rank (files, bytes, seconds added)."""

    @property
    def record(self) -> dict[str, Any]:
        """What the checkpoint says about itself: format, version, world size, strategy, step."""
        return self.contents[layout.RECORD]


def find_latest(
    directory: Path,
    map_location: str | torch.device = "cpu",
    runtime: Any = None,
    *,
    exclude: frozenset[Path] = frozenset(),
) -> Found | None:
    """The newest checkpoint that verifies and loads (but ``exclude``, which failed later); newer ones that do
    not are skipped with one warning each, naming the file: damaged, crafted, or whose name, manifest and record
    disagree on its step. Whatever goes wrong while reading a candidate skips it.

    With a ``runtime`` of several ranks every rank calls this (sharded loads are collectives, so all
    must pick the same checkpoint): rank 0's listing is the candidates, each rank hashes its share of
    each candidate's pieces in turn (integrity.verify) and one all-gather per candidate decides, so a
    piece that one rank finds damaged makes every rank skip that checkpoint."""
    ranks = _Ranks(runtime)
    for step, path in ranks.same(layout.list_checkpoints(directory)):
        if Path(path) in exclude:
            continue
        found, problem = None, None
        try:
            found = _open(Path(path), step, map_location, ranks)
        except CheckpointError as exc:
            problem = exc.message
        except OSError as exc:  # vanished or unreadable between listing and reading
            problem = f"{path} is unreadable: {exc}"
        except Exception as exc:  # anything else a candidate does to its reader: it is skipped on every rank
            problem = f"reading it failed: {plain_words(exc)}"
        if not ranks.gather_ok(problem, path):
            continue
        if found.verified is not None and ranks.rank == 0:
            log.info("%s: %s", found.path, found.verified)
        return found
    return None


def plain_words(exc: BaseException) -> str:
    """An exception in one line, without torch's advice to load with ``weights_only=False`` (the very
    protection docs/security.md relies on): a weights-only refusal is said for what it is."""
    text = f"{type(exc).__name__}: {exc}"
    if "weights_only" in text or "Weights only load failed" in text:
        return f"{type(exc).__name__}: its bytes are not what trainscale writes (a weights-only load refused them)"
    line = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return line if len(line) <= 300 else line[:299] + "…"


def _open(path: Path, step: int, map_location: str | torch.device, ranks: _Ranks) -> Found:
    if path.is_symlink():  # it would load whatever it points at, here or on another run's disk
        raise CheckpointError(
            f"{path} is a symbolic link to {os.readlink(path)}, not a checkpoint trainscale "
            "wrote (its saves never make one)"
        )
    if path.is_dir():
        contents, shards, verified = sharded.open_checkpoint(path, ranks.rank, ranks.world_size)
        found = Found(path, step, contents, shards, verified)
    else:
        contents, verified = files.open_file(path, map_location, rank=ranks.rank, world_size=ranks.world_size)
        found = Found(path, step, contents, verified=verified)
    said = {"its record": found.record.get("step"), "its saved step": found.contents.get("step")}
    differ = {where: value for where, value in said.items() if isinstance(value, int) and value != step}
    if differ:  # a checkpoint renamed or linked under another step's name
        raise CheckpointError(
            f"{path} is named for step {step}, but "
            + " and ".join(f"{where} says step {value}" for where, value in differ.items()),
            hint="a checkpoint is resumed under its own step only: rename it back, or delete it",
        )
    return found


class _Ranks:
    """The ranks that choose a checkpoint together (just this process without a process group)."""

    def __init__(self, runtime: Any) -> None:
        self.distributed = bool(getattr(runtime, "is_distributed", False))
        self.rank = runtime.rank if self.distributed else 0
        self.world_size = runtime.world_size if self.distributed else 1

    def same(self, value: Any) -> Any:
        """Rank 0's ``value`` on every rank."""
        if not self.distributed:
            return value

        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather_ok(self, problem: str | None, path: Any) -> bool:
        """Whether no rank had a ``problem`` with the checkpoint at ``path``; rank 0 warns once when one did."""
        problems = [(rank, p) for rank, p in enumerate(self.gather(problem)) if p is not None]
        if problems and self.rank == 0:
            rank, text = problems[0]
            seen = f" (found by rank {rank})" if self.distributed else ""
            log.warning("skipping checkpoint %s: %s%s", Path(path).name, text, seen)
        return not problems

    def gather(self, value: Any) -> list[Any]:
        """Every rank's ``value``, in rank order, on every rank."""
        if not self.distributed:
            return [value]

        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, value)
        return out


class Checkpointer:
    """Checkpoints with the barriers the seeds describe, kept to the newest ``keep``.

    ``strategy``: a name or a strategy object. Its name is recorded (a checkpoint another strategy
    wrote is refused); its ``storage`` says up front whether every rank writes and whether saves may go
    in the background. What a save writes where is the saved :class:`ModelState`'s ``storage``;
    entries without one are rank 0's file.

        ckpt = Checkpointer("ckpts", rt, strategy=strategy)
        state = {"model": strategy.checkpoint_state(model, opt), "scheduler": scheduler, "step": step}
        ckpt.save(step, state)         # every rank calls it
        found = ckpt.restore(state)    # in place; found.contents["step"] is the saved step

    Constructing one is a collective when there is a process group (every rank constructs it): an
    unusable directory (read-only, under a regular file) is refused here on every rank.

    ``about``: fields every checkpoint's record carries besides trainscale's own (the loop's global batch).

    ``asynchronous``: True saves in the background (background.py): ``save`` returns once the state
    is copied, and :meth:`wait` (every rank) returns once the save in flight is on disk; None does so
    wherever the storage allows it (rank-0 files and DCP shards, not a strategy's native files);
    False (the default) saves synchronously.
    """

    def __init__(
        self,
        directory: str | Path,
        runtime: Any,
        *,
        keep: int = 2,
        strategy: Any = "ddp",
        asynchronous: bool | None = False,
        about: Mapping[str, Any] | None = None,
    ) -> None:
        if keep < 1:
            raise CheckpointError(f"keep={keep} must be >= 1", hint="keep at least the newest checkpoint")
        self.directory = Path(directory)
        self.runtime = runtime
        self.keep = keep
        self.about = dict(about or {})
        """Added to every checkpoint's record (and manifest), e.g. the training loop's global batch."""
        self.durations: list[float] = []
        """Seconds each complete save took on this rank (staging and the background write, for a background one)."""
        self.strategy = strategy if isinstance(strategy, str) else strategy.name
        self.storage = FILE if isinstance(strategy, str) else getattr(strategy, "storage", FILE)
        self.asynchronous = self.storage.resolve_async(asynchronous, self.strategy)
        # Refused now, on every rank, rather than at the first save after hours of training.
        disk.check_directory(self.directory, runtime, writes=self.storage.writes_on_every_rank or runtime.is_main)
        run_dir = getattr(getattr(runtime, "env", None), "run_dir", None)
        self._run_dir, self._locked = run_dir, None
        self._inflight = background.InFlight()
        self._stager: Any = None
        if run_dir and getattr(runtime, "is_main", False):  # a restart can then name its checkpoint
            layout.note_directory(run_dir, self.directory)

    def _lock(self) -> None:
        """One run per directory (lock.py), from the first save or resume of one that exists: rank 0 takes it,
        every rank learns whether it could (a collective); released by :meth:`close` or with the process."""
        if self._locked is not None:
            return
        main = getattr(self.runtime, "is_main", True)
        holder = lock.acquire(self.directory, self._run_dir) if main else None
        self._locked = main and holder is None
        if self._locked:  # released by close(), or when a Checkpointer dropped without close() is collected
            self._unlock = weakref.finalize(self, lock.release, self.directory)
        holder = _Ranks(self.runtime).same(holder)
        if holder is not None:
            self._locked = None
            raise CheckpointError(
                f"checkpoint directory {self.directory} is in use by another run ({holder})",
                hint="two runs on one directory damage each other's checkpoints: wait for that run to end or stop "
                "it, or give this one another --checkpoint-dir",
            )

    def save(
        self,
        step: int,
        state: Mapping[str, Any],
        *,
        blocking: bool = False,
        on_complete: Callable[[], None] | None = None,
    ) -> Path:
        """Every rank calls this; rank 0 writes (every rank, for sharded storage). Returns the path
        (on every rank). In the background when this Checkpointer is ``asynchronous`` and not
        ``blocking``, after the save in flight has finished; ``on_complete`` runs on rank 0 once the
        checkpoint is on disk (in the background, for a background save)."""
        self._lock()
        began = time.perf_counter()
        model, entries = _split(state)
        storage = model.storage if model is not None else FILE
        record = layout.record(
            version=__version__, world_size=self.runtime.world_size, strategy=self.strategy, step=step, **self.about
        )
        if model is not None:
            entries = _merge(model.state_dict(), entries)
        waited = time.perf_counter()
        self.wait()  # the previous save first: one in flight at most, its failure raised here
        began += time.perf_counter() - waited  # this save's own time, not the wait for the previous one
        if self.asynchronous and not blocking and storage.can_background:
            # Staged now (training waits), written in the background (background.py).
            if self._stager is None:
                self._stager = background.stager(getattr(self.runtime, "device", None))
            path, write = storage.save_async(
                self.directory,
                step,
                entries,
                record,
                self.runtime,
                stager=self._stager,
                group=lambda: self._group,
                before_rename=lambda: background.hold_point(step),
            )
            if write is None:  # nothing to write on this rank
                return path

            staged = time.perf_counter() - began

            def job() -> None:
                started = time.perf_counter()
                write()
                self.durations.append(staged + time.perf_counter() - started)
                self._saved(on_complete)

            self._inflight.start(step, path, job)
            return path
        path = storage.save(self.directory, step, entries, record, self.runtime, model)
        self._saved(on_complete)
        self.runtime.barrier()  # nobody runs ahead (or exits) before the checkpoint is on disk
        self.durations.append(time.perf_counter() - began)
        return path

    def save_seconds(self) -> float | None:
        """How long a save takes here: the longest of the last three (None before the first)."""
        return max(self.durations[-3:]) if self.durations else None

    def _saved(self, on_complete: Callable[[], None] | None) -> None:
        """Once a checkpoint is on disk, rank 0 removes the old ones and runs ``on_complete``."""
        if self.runtime.is_main:
            self._prune()
            if on_complete is not None:
                on_complete()

    @functools.cached_property
    def _group(self) -> Any:
        """The background's own process group, made by every rank at the same (first) save that needs it."""
        return background.checkpoint_group(self.runtime)

    def wait(self) -> None:
        """Every rank: return once the background save in flight is complete on every rank; one that
        failed on any rank raises CheckpointError on every rank. A no-op when saves are synchronous."""
        if not self.asynchronous:
            return
        error = self._inflight.wait()
        failed = background.failed_ranks(self.runtime, error is not None)
        if error is not None:
            raise error
        if failed:
            raise CheckpointError(
                f"the background save of the newest checkpoint in {self.directory} failed on "
                f"rank(s) {', '.join(map(str, failed))}",
                hint="that rank's log names the error; the newest complete checkpoint stays the "
                "one to resume from (or save synchronously with --no-checkpoint-async)",
            )

    def close(self) -> None:
        """This rank: finish the save in flight (without reporting: :meth:`wait` does) and free the
        worker and the staged host copy."""
        self._inflight.close()
        if self._stager is not None:
            self._stager.close()
            self._stager = None
        if self._locked:
            self._unlock()  # once, however often it is called
        self._locked = None

    def restore(self, state: Mapping[str, Any]) -> Found | None:
        """Load the newest complete checkpoint into ``state``'s ModelState and Stateful entries (every
        rank calls it: sharded loads are collectives). None when there is none yet. A checkpoint whose load
        fails on any rank after it was chosen (shards whose bytes verify but do not load) is skipped like a
        damaged one, and the previous one is loaded over whatever it had set."""
        model, _ = _split(state)
        if _Ranks(self.runtime).same(self.directory.is_dir()):
            self._lock()  # before resuming from what another run may be writing
        failed: frozenset[Path] = frozenset()
        while True:
            found = self.latest(exclude=failed)
            if found is None:
                return None
            problem = None
            try:
                if model is not None:
                    model.storage.restore(model, found)
            except UnreadableShards as exc:  # not a checkpoint of another model: that stays a refusal
                problem = f"loading it failed: {exc.message}"
            except (RuntimeError, KeyError) as exc:
                if isinstance(exc, RuntimeError) and "Error(s) in loading state_dict" not in str(exc):
                    raise  # out of memory, a collective's failure: not the checkpoint's to answer for
                raise CheckpointError(
                    f"{found.path} holds another model's state: {_mismatch(exc)}",
                    hint="start a new checkpoint directory (--fresh moves these checkpoints "
                    "aside), or resume with the model and optimizer that wrote it",
                ) from exc
            if _Ranks(self.runtime).gather_ok(problem, found.path):
                for name, entry in state.items():
                    if isinstance(entry, Stateful) and not isinstance(entry, ModelState) and name in found.contents:
                        entry.load_state_dict(found.contents[name])
                return found
            failed |= {found.path}

    def _prune(self) -> None:
        # A link named like a checkpoint is none of this run's (never loaded: find_latest): counted, it would
        # have a real checkpoint deleted in its place, and left dangling, block the save of its step.
        own = [(step, path) for step, path in layout.list_checkpoints(self.directory) if not path.is_symlink()]
        for _, old in own[self.keep :]:
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
            else:
                old.unlink(missing_ok=True)
                layout.sidecar_path(old).unlink(missing_ok=True)
        # What saves killed midway left: never complete, never loaded, now removed.
        for stale in layout.leftovers(self.directory):
            if stale.is_dir():
                shutil.rmtree(stale, ignore_errors=True)
            else:
                stale.unlink(missing_ok=True)

    def latest(self, exclude: frozenset[Path] = frozenset()) -> Found | None:
        """The newest complete, verified checkpoint (but ``exclude``), refused when another strategy wrote it.
        Every rank calls it (find_latest: they agree on which)."""
        found = find_latest(self.directory, map_location="cpu", runtime=self.runtime, exclude=exclude)
        if found is not None:
            written_by = found.record.get("strategy")
            portable = {written_by, self.strategy} <= PORTABLE or (
                written_by == "deepspeed" and self.strategy in PORTABLE
            )
            if written_by not in (None, self.strategy) and not portable:
                raise CheckpointError(
                    f"{found.path} was written by strategy {written_by!r}, this run uses {self.strategy!r}",
                    hint=f"resume with --strategy {written_by}; or start anew: add --fresh (the checkpoints are "
                    "moved aside, not deleted) or give another checkpoint or experiment directory",
                )
        return found


def _mismatch(exc: BaseException) -> str:
    """torch's load_state_dict refusal (every key listed) in a few words; anything else in its first line."""
    text = str(exc)
    if "Error(s) in loading state_dict" not in text:
        return plain_words(exc)
    lines = [line.strip() for line in text.splitlines()]
    missing = sum(line.count('"') // 2 for line in lines if line.startswith("Missing key(s)"))
    unexpected = sum(line.count('"') // 2 for line in lines if line.startswith("Unexpected key(s)"))
    shapes = sum(line.startswith("size mismatch") for line in lines)
    return (
        f"its parameters are not this model's ({missing} of this model's missing, {unexpected} not this "
        f"model's, {shapes} of another shape)"
    )


def _split(state: Mapping[str, Any]) -> tuple[ModelState | None, dict[str, Any]]:
    """(the one ModelState entry, every other entry as it is saved: Stateful ones as their state_dict())."""
    models = [v for v in state.values() if isinstance(v, ModelState)]
    if len(models) > 1:
        raise CheckpointError(
            f"{len(models)} model states in one checkpoint",
            hint="save one strategy's checkpoint_state(model, optimizer) per checkpoint",
        )
    entries = {
        k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state.items() if not isinstance(v, ModelState)
    }
    return (models[0] if models else None), entries


def _merge(model_entries: dict[str, Any], entries: dict[str, Any]) -> dict[str, Any]:
    clash = sorted(set(model_entries) & set(entries))
    if clash:
        raise CheckpointError(
            f"checkpoint entries {clash} are both model state and other state",
            hint="rename the other entries (the model state owns 'model' and 'optimizer')",
        )
    return {**model_entries, **entries}
