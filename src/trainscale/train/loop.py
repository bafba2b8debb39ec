"""The training loop every built-in workload runs: a workload says what to train (:class:`Task`: a
model, an optimizer, a loss, its data), the :class:`Loop` does the rest, the same way for all: the
strategy's wrapping, resume (bitwise, loader position included), periodic, end-of-epoch, final and
preemption checkpoints (in the background where safe), gradient accumulation, evaluation, per-epoch
records, progress lines, the trackers' curves, the memory table and ``--metrics-out``. What each of
these does: docs/workloads.md, "The training loop".
"""

from __future__ import annotations

import functools
import itertools
import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainscale.checkpoint import Checkpointer, RNGState, atomic_write_text, layout
from trainscale.errors import CheckpointError, ConfigError
from trainscale.observe.reading import rank_stats
from trainscale.observe.records import metrics_dir, read_lines
from trainscale.runtime.memory import report as memory_report
from trainscale.runtime.threads import node_cpus
from trainscale.strategies import get_strategy
from trainscale.strategies.base import OptimizerSource
from trainscale.train import fault
from trainscale.train.console import Progress, duration
from trainscale.train.metrics import LossLog, epoch_curves, write_metrics
from trainscale.train.observing import check_network, recorder_for, step_flops
from trainscale.train.options import TrainOptions


@dataclass(kw_only=True)
class Task:
    """What a workload trains; :class:`Loop` runs it."""

    name: str
    """The workload's name, for log lines and the metrics."""
    model: Callable[[], nn.Module]
    """Builds the model; called after ``torch.manual_seed(--seed)``, so every rank starts alike."""
    optimizer: OptimizerSource
    """An OptimizerSpec or factory (the model is built inside the loop)."""
    loss: Callable[[nn.Module, Any], torch.Tensor]
    """The mean loss of one micro-batch (as the loader yields it) under the model."""
    loader: Any
    """This rank's batches, one epoch per ``iter()``; ``len()`` micro-batches; its epoch in
    ``state_dict()``/``load_state_dict()`` (DeviceTensorLoader, DistributedLoader)."""
    samples: int
    """Training samples in the whole set (for the first log line)."""
    evaluate: Callable[[nn.Module], dict[str, float]] | None = None
    """Held-out metrics at the end of each epoch, e.g. {"test_loss": ..., "accuracy": ...}; a collective."""
    scheduler: Callable[[torch.optim.Optimizer, int], Any] | None = None
    """An LR scheduler for (the torch optimizer, the run's optimizer steps); stepped once per step."""
    past_epochs: bool = False
    """--max-steps may run past --epochs (a language model reads its corpus again); else both bound the run."""
    tokens_per_sample: int | None = None
    """Set for language models: the records then carry tokens/s too."""
    extra: dict[str, Any] | None = None
    """Added to the run's result (and metrics JSON)."""


class Loop:
    """``Loop(rt, opts, task).run()`` -> the run's result (also written to ``--metrics-out``).

    ``checkpoint_dir``: where checkpoints go (default ``--checkpoint-dir``; none: no checkpoints);
    ``resume``: whether to resume from the newest one there; ``state_file``: a human-readable JSON of the
    newest checkpoint (seed 003's state.json); ``tracker_dir``: where the ``--tracker`` trackers write
    (default: the run directory), ``tracker_id``: their run's id there (gpt: the experiment's own).
    """

    def __init__(
        self,
        rt: Any,
        opts: TrainOptions,
        task: Task,
        *,
        checkpoint_dir: str | Path | None = None,
        resume: bool = True,
        state_file: Path | None = None,
        tracker_dir: str | Path | None = None,
        tracker_id: str | None = None,
    ) -> None:
        self.rt, self.opts, self.task = rt, opts, task
        self.accumulation = opts.grad_accum
        self.epoch_batches = len(task.loader)  # micro-batches of a whole epoch on this rank
        self.steps_per_epoch = self.epoch_batches // self.accumulation
        if self.steps_per_epoch < 1:
            raise ConfigError(
                f"one epoch has {len(task.loader)} micro-batches, fewer than --grad-accum {self.accumulation}",
                hint="lower --grad-accum or --batch-size",
            )
        self.total = self.steps_per_epoch * opts.epochs  # optimizer steps of the whole run
        if opts.max_steps is not None:
            self.total = opts.max_steps if task.past_epochs else min(opts.max_steps, self.total)
        self.directory, self.resume, self.state_file = checkpoint_dir or opts.checkpoint_dir, resume, state_file
        self.tracker_dir, self.tracker_id = tracker_dir, tracker_id
        self.losses = LossLog(self._log if opts.trackers else None)
        self.step = 0
        self.saved_at = -1
        self.checkpoint_stalls: list[float] = []  # seconds training waited, per save
        self.checkpoint_waits = 0.0  # seconds waited for the save in flight at the end or a preemption
        self.fault = fault.planned()
        self.resumed = False
        self.per_rank_samples = opts.batch_size * self.accumulation
        self._first_batch: Any = None  # a step's FLOPs are counted with it at the end

    # -- setting up ------------------------------------------------------------------------------
    def _build(self) -> None:
        rt, opts, task = self.rt, self.opts, self.task
        self.strategy = get_strategy(opts.strategy)
        self._keep_global_batch()
        self.strategy = self.strategy.with_batch(opts.batch_size, self.accumulation)
        torch.manual_seed(opts.seed)  # identical initial weights on every rank and every world size
        self.model, self.optimizer = self.strategy.wrap(task.model(), task.optimizer, rt)
        if opts.compile:  # --compile: the wrapped model, so DDP's buckets still overlap backward
            self.model = self.strategy.compile(self.model)
        self.lr_optimizer = self.strategy.torch_optimizer(self.optimizer)
        self.scheduler = (
            task.scheduler(self.lr_optimizer, self.total)
            if task.scheduler is not None and self.lr_optimizer is not None
            else None
        )
        if self.directory is not None and opts.fresh:
            set_aside(Path(self.directory), rt)
        self.checkpointer = (
            Checkpointer(
                self.directory,
                rt,
                strategy=self.strategy,
                asynchronous=opts.checkpoint_async,
                about={"global_batch": self.global_batch},
            )
            if self.directory is not None
            else None
        )

    def _state(self) -> dict[str, Any]:
        """What a checkpoint holds (the entries the built-in workloads have always saved)."""
        state = {
            "model": self.strategy.checkpoint_state(self.model, self.optimizer),
            "step": self.step,
            "rng": RNGState(self.rt.device),
            "data": self.task.loader,
            "global_batch": self.global_batch,
        }
        if self.scheduler is not None:
            state["scheduler"] = self.scheduler
        return state

    @property
    def global_batch(self) -> int:
        """Samples per optimizer step over all ranks."""
        return self.opts.batch_size * self.accumulation * self.rt.world_size

    def _resume(self) -> tuple[int, int]:
        """(epoch, optimizer steps of it already done) to start from. The loader's state is a global cursor
        (data/loader.py): a checkpoint of any number of ranks, mid-epoch or not, resumes the rest of its epoch
        on this run's ranks, every sample of it once."""
        found = self.checkpointer.restore(self._state()) if self.checkpointer and self.resume else None
        if found is None:
            return 0, 0
        if "data" not in found.contents:
            raise CheckpointError(
                f"{found.path} was written before trainscale kept the data position as a global "
                "cursor (it has no 'data' entry): where its epoch stands is not known",
                hint="resume it with the trainscale that wrote it, or start anew with --fresh (the "
                "checkpoints are moved aside, not deleted)",
            )
        self.step = self.saved_at = int(found.contents["step"])
        written = int(found.record["world_size"])
        saved_batch = int(found.contents.get("global_batch") or self.global_batch)
        if saved_batch != self.global_batch and written != self.rt.world_size:
            self.rt.print(
                f"trainscale: global batch {saved_batch} (the checkpoint's, on {written} rank(s)) is now "
                f"{self.global_batch} on {self.rt.world_size} rank(s)" + self._why_not
            )
        loader = self.task.loader
        position = loader.state_dict()
        if len(loader) < self.accumulation:  # less than one step of this shape left in the epoch
            self.rt.print(
                f"trainscale: the {loader.remaining()} sample(s) left of epoch {position['epoch'] + 1} "
                f"make less than one step of {self.rt.world_size} rank(s) x batch {self.opts.batch_size}"
                f"{' x accumulation ' + str(self.accumulation) if self.accumulation > 1 else ''}: the "
                "next epoch starts now"
            )
            loader.load_state_dict({"epoch": position["epoch"] + 1, "consumed": 0})
            position = loader.state_dict()
        epoch, done = position["epoch"], self.steps_per_epoch - len(loader) // self.accumulation
        if not self.task.past_epochs:  # the rest of this epoch on this shape, then whole epochs
            left = (
                len(loader) // self.accumulation + self.steps_per_epoch * (self.opts.epochs - epoch - 1)
                if epoch < self.opts.epochs
                else 0
            )
            self.total = self.step + left
            if self.opts.max_steps is not None:
                self.total = min(self.total, self.opts.max_steps)
        if self.step >= self.total:
            self._nothing_to_train(found)
        self.resumed = True
        by = found.record.get("strategy")
        self.rt.print(
            f"Resumed from {found.path} at step {self.step} (epoch {epoch + 1}, {position['consumed']} "
            f"of its {position['samples']} samples done); written with world size {written}, now "
            f"{self.rt.world_size}"
            + (f"; by strategy {by}, now {self.strategy.name}" if by and by != self.strategy.name else "")
            + f"; {found.verified}"
        )
        return epoch, done

    def _keep_global_batch(self) -> None:
        """Before the strategy is shaped: a run resuming a checkpoint written on another number of ranks keeps
        its global batch by gradient accumulation where a whole number of micro-batches makes it (said in one
        line); the resume says so where it cannot (:attr:`_why_not`)."""
        self._why_not = ""
        said = (
            layout.newest_record(Path(self.directory))
            if self.directory is not None and self.resume and not self.opts.fresh
            else None
        )
        saved, written = (said or {}).get("global_batch"), (said or {}).get("world_size")
        if (
            not isinstance(saved, int)
            or not isinstance(written, int)
            or saved == self.global_batch
            or written == self.rt.world_size
        ):  # the same ranks: a new --batch-size/--grad-accum is the user's
            return
        per_micro = self.opts.batch_size * self.rt.world_size
        if saved % per_micro:
            self._why_not = f": no whole number of micro-batches of {per_micro} makes {saved}"
            return
        if saved // per_micro > 1 and getattr(self.strategy, "static_graph", None) is True:
            self._why_not = f": {self.strategy.name}:static_graph=true does not accumulate"
            return
        if self.epoch_batches < saved // per_micro:
            self._why_not = f": an epoch has fewer than {saved // per_micro} micro-batches"
            return
        self.accumulation = saved // per_micro
        self.steps_per_epoch = self.epoch_batches // self.accumulation
        self.per_rank_samples = self.opts.batch_size * self.accumulation
        self.total = self.steps_per_epoch * self.opts.epochs
        if self.opts.max_steps is not None:
            self.total = self.opts.max_steps if self.task.past_epochs else min(self.opts.max_steps, self.total)
        self.rt.print(
            f"trainscale: global batch {saved} kept on {self.rt.world_size} rank(s) (the checkpoint's "
            f"{written}): gradient accumulation {self.accumulation} x batch {self.opts.batch_size}"
        )

    def _after_resume(self) -> None:
        """The strategy's step before the first resumed one (DDP lays out its gradient buckets as the
        interrupted run had): one forward and backward of the batch that comes next, all discarded."""
        loader = self.task.loader
        position = loader.state_dict()
        batch = next(iter(loader))
        loader.load_state_dict(position)
        with self.rt.guard(self.step):
            self.strategy.after_resume(self.model, lambda: self.task.loss(self.model, batch).backward())

    def _nothing_to_train(self, found: Any) -> None:
        """The newest checkpoint is at or past the run's last step. A restart or requeue of a run that
        had finished ends cleanly; a new command that would train nothing is an error, not a success."""
        last = f"--max-steps {self.opts.max_steps}" if self.opts.max_steps else f"--epochs {self.opts.epochs}"
        if self.rt.attempt:
            self.rt.print(f"Nothing left to train: {found.path} is at step {self.step}, the run's last ({last})")
            return
        raise CheckpointError(
            f"{found.path} is at step {self.step}, at or past this run's last step {self.total} ({last}): resuming "
            "would train nothing",
            hint=f"to train on, raise {last.split()[0]} above {self.step}; to start anew, add --fresh (the "
            f"checkpoints in {self.directory} are moved aside, not deleted) or give another checkpoint or "
            "experiment directory",
        )

    # -- running ---------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        rt, opts = self.rt, self.opts
        self._build()
        epoch, done = self._resume()
        preemption = rt.handle_preemption()  # from here on SIGUSR1 only sets a flag, checked at step boundaries
        if self.checkpointer is not None:  # the last save before the time limit is timed from the measured ones
            preemption.save_seconds = self.checkpointer.save_seconds
        if rt.attempt:
            rt.print(f"Attempt {rt.attempt + 1} of this job (restarted or requeued {rt.attempt} time(s))")
        # the recorder every script has (observe/hooks.py) records the steps; the loop adds what it alone knows
        self.recorder = recorder_for(rt)
        if self.recorder is not None:
            self.recorder.meta.update(
                workload=self.task.name,
                strategy=self.strategy.name,
                batch_size=opts.batch_size,
                accumulation=self.accumulation,
                total_steps=self.total,
            )  # the run's last step: a watcher's ETA
            self.recorder.step = self.step
        if self.resumed and self.step < self.total:
            self._after_resume()
            if self.recorder is not None:
                self.recorder.discard_step()  # the discarded step is no step
        self.progress = Progress(
            steps_per_epoch=self.steps_per_epoch,
            total=self.total,
            samples_per_step=self.per_rank_samples * rt.world_size,
            epochs=None if self.task.past_epochs else opts.epochs,
            every=opts.log_every,
        )
        rt.print(self._describe())
        rt.print(self._where())
        if opts.trackers:
            rt.use_trackers(
                opts.trackers,
                directory=self.tracker_dir,
                run_id=self.tracker_id,
                config={
                    "workload": self.task.name,
                    "world_size": rt.world_size,
                    "strategy": self.strategy.name,
                    **asdict(opts),
                },
            )
        history: list[dict] = []
        preempted = False
        epochs = itertools.count(epoch) if self.task.past_epochs else range(epoch, opts.epochs)
        try:
            for epoch in epochs:
                if self.step >= self.total:
                    break
                rt.synchronize()  # the epoch's seconds are of work done, not queued: both ends wait for the device
                began = time.perf_counter()
                seen, epoch_loss, preempted = self._epoch(epoch, done, preemption)
                done = 0
                if preempted:
                    self._preempted(preemption)
                    break
                rt.synchronize()
                history.append(self._record(epoch, seen, epoch_loss, time.perf_counter() - began))
                if not opts.checkpoint_every:
                    self._save()
            if not preempted and self.saved_at != self.step:
                self._save()
            self._finish_saves()
        finally:
            if self.recorder is not None:
                self.recorder.flush()
        return self._result(history, preempted)

    def _epoch(self, epoch: int, done: int, preemption: Any) -> tuple[int, torch.Tensor, bool]:
        """One epoch's steps from its step ``done`` (or up to the run's last); (steps done, their summed
        loss on the device, whether a preemption stopped it)."""
        rt, opts = self.rt, self.opts
        loader = self.task.loader
        steps = len(loader) // self.accumulation  # the whole epoch, or what is left of it (a resumed run)
        batches = iter(loader)  # from where the loader was put (a resumed run: mid-epoch)
        seen, loss_sum = 0, torch.zeros((), device=rt.device)
        while seen < steps and self.step < self.total:
            fault.maybe_inject(self.step, rt.env, self.fault)
            loss = self._optimizer_step(batches)
            self.step, done, seen = self.step + 1, done + 1, seen + 1
            if (
                seen == steps
            ):  # what an accumulation does not fill stays unread: a save from here on is the next epoch's
                loader.end_epoch()
            if seen == 1 and self.recorder is not None:
                check_network(rt, self.recorder.run_dir)
            loss_sum += loss
            self.losses.add(self.step, loss)
            if self.progress.due(self.step, done) and rt.is_main:
                rt.print(self.progress.line(epoch, done, self.step, self.losses.flush()))
            if self.checkpointer is not None and opts.checkpoint_every and self.step % opts.checkpoint_every == 0:
                self._save()
            if preemption.requested():  # agreed across ranks: all stop at the same step
                return seen, loss_sum, True
        return seen, loss_sum, False

    def _optimizer_step(self, batches) -> torch.Tensor:
        """One optimizer step over ``--grad-accum`` micro-batches (its phases timed by the recorder every script
        has: observe/hooks.py); its loss (the micro-batches' mean)."""
        model, strategy = self.model, self.strategy
        step_loss = torch.zeros((), device=self.rt.device)
        for micro in range(self.accumulation):
            last = micro == self.accumulation - 1
            batch = next(batches)
            if self._first_batch is None:
                self._first_batch = batch
            with self.rt.guard(self.step):
                with strategy.accumulate(model, last=last):
                    loss = self.task.loss(model, batch) / self.accumulation
                    strategy.backward_loss(loss, model)
                strategy.micro_step(self.optimizer, model, last=last)
            step_loss += loss.detach()
        if self.scheduler is not None:
            self.scheduler.step()
        return step_loss

    # -- reporting and saving --------------------------------------------------------------------
    def _describe(self) -> str:
        rt, opts, task = self.rt, self.opts, self.task
        n_params = self.strategy.num_parameters(self.model)
        accumulation = f" x accumulation {self.accumulation}" if self.accumulation > 1 else ""
        return (
            f"{task.name}: {n_params:,} parameters, {task.samples} training samples, {rt.world_size} rank(s) x "
            f"batch {opts.batch_size}{accumulation}, {self.steps_per_epoch} steps/epoch, strategy "
            f"{self.strategy.name}, device {rt.device}"
        )

    def _where(self) -> str:
        """Where this run's files go (said once, on rank 0)."""
        run_dir = self.recorder.run_dir if self.recorder is not None else None
        parts = [
            f"run directory {run_dir} (step records: trainscale report {run_dir})"
            if run_dir
            else "no run directory (launch with trainscale run or trainscale slurm for step records)"
        ]
        parts.append(
            f"checkpoints in {self.directory}"
            if self.checkpointer is not None
            else "no checkpoints (--checkpoint-dir DIR saves and resumes them)"
        )
        return "Files: " + "; ".join(parts)

    def _log(self, values: dict[str, float], step: int, at: float | None = None) -> None:
        self.rt.log(values, step=step, at=at)

    def _lr(self) -> float:
        return float(self.lr_optimizer.param_groups[0]["lr"]) if self.lr_optimizer is not None else self.opts.lr

    def _record(self, epoch: int, seen: int, loss_sum: torch.Tensor, seconds: float) -> dict[str, Any]:
        rt = self.rt
        epoch_time = rt.mean(seconds)
        samples = seen * self.opts.batch_size * self.accumulation * rt.world_size
        record = {
            "epoch": epoch + 1,
            "steps": seen,
            "time_s": epoch_time,
            "samples_per_s": samples / epoch_time,
            "train_loss": rt.mean(loss_sum / max(1, seen)),
            "lr": self._lr(),
        }
        held_out = self.task.evaluate(self.model) if self.task.evaluate is not None else {}
        record.update(held_out)
        if self.task.tokens_per_sample:
            record["tokens_per_s"] = record["samples_per_s"] * self.task.tokens_per_sample
        if self.recorder is not None:
            self.recorder.epoch(
                epoch + 1,
                time_s=epoch_time,
                samples_per_s=record["samples_per_s"],
                train_loss=record["train_loss"],
                **held_out,
            )
        if self.opts.trackers:  # values already the same on every rank: rank 0 writes them
            self.losses.flush()  # the steps before this one first: W&B takes steps in order only
            self._log(epoch_curves(record, held_out), self.step)
        shown = ", ".join(
            f"held-out loss {v:.4f}" if k == "test_loss" else f"{k} {v:.2%}" if k == "accuracy" else f"{k} {v:.4f}"
            for k, v in held_out.items()
        )
        eta = self.progress.eta(self.step) if self.step < self.total else None
        rt.print(
            f"Epoch {epoch + 1}: loss {record['train_loss']:.4f}{', ' + shown if shown else ''}, "
            f"time {epoch_time:.2f}s, {record['samples_per_s']:.0f} samples/s, step {self.step}/{self.total}"
            + (f", ETA {duration(eta)}" if eta is not None else "")
        )
        return record

    def _save(self, blocking: bool = False) -> None:
        if self.checkpointer is None:
            return
        loss = self.losses.flush()
        written = None
        if self.state_file is not None:  # the seed's state.json, written (rank 0) once the checkpoint is on disk
            state = {
                "step": self.step,
                "epoch": self.step / self.steps_per_epoch,
                "loss": loss,
                "lr": self._lr(),
                "time": time.time(),
            }
            written = functools.partial(atomic_write_text, self.state_file, json.dumps(state))
        began = time.perf_counter()
        self.checkpointer.save(self.step, self._state(), blocking=blocking, on_complete=written)
        self.checkpoint_stalls.append(time.perf_counter() - began)
        self.saved_at = self.step

    def _finish_saves(self) -> None:
        """Every rank: the save in flight complete on disk (its failure raised here)."""
        if self.checkpointer is not None:
            began = time.perf_counter()
            self.checkpointer.wait()
            self.checkpointer.close()
            self.checkpoint_waits += time.perf_counter() - began

    def _preempted(self, preemption: Any) -> None:
        if self.saved_at != self.step:
            self._save(blocking=True)  # after the save in flight, if any
        self._finish_saves()  # complete on disk before the requeue
        where = f" to {self.directory}" if self.checkpointer is not None else " nowhere (no --checkpoint-dir)"
        head = (
            f"Preempted ({preemption.received or 'signal on another rank'}) at step {self.step}, attempt "
            f"{self.rt.attempt}: checkpoint saved{where}"
        )
        preemption.requeue_and_log(head, self.rt.print)

    def _result(self, history: list[dict], preempted: bool) -> dict[str, Any]:
        rt, strategy = self.rt, self.strategy
        self.losses.flush()
        result = {
            "workload": self.task.name,
            "world_size": rt.world_size,
            "num_nodes": rt.num_nodes,
            "device": str(rt.device),
            "backend": rt.backend,
            "strategy": strategy.name,
            "options": asdict(self.opts),
            "steps": self.step,
            "epochs": history,
            "preempted": preempted,
            "attempt": rt.attempt,
            "train_time_s": sum(h["time_s"] for h in history),
            # what this rank really had (a study's achievable ideal counts these, not what a profile claims)
            "threads": torch.get_num_threads(),
            "usable_cpus": node_cpus(rt),
            # whether saves ran in the background and how long training waited for them (this rank)
            "checkpoint_async": self.checkpointer is not None and self.checkpointer.asynchronous,
            "checkpoint_stall_s": self.checkpoint_stalls,
            "checkpoint_wait_s": self.checkpoint_waits,
            **(self.task.extra or {}),
        }
        # the per-rank memory table on rank 0 (a collective)
        result["memory"] = memory_report(rt, strategy.held_bytes(self.model, self.optimizer), strategy.name)
        recorded = None
        if self.recorder is not None:
            if self._first_batch is not None:  # sharded models are counted the loop's way (a fake copy)
                module, batch = strategy.unwrap(self.model), self._first_batch
                self.recorder.count_flops = lambda: step_flops(
                    module, self.task.model, self.task.loss, batch, self.accumulation, device=rt.device
                )
            recorded = self.recorder.finish()
        if recorded is not None:
            result["recorded"] = recorded
            if self.opts.breakdown and rt.is_main:
                rt.print(breakdown_line(self.recorder.run_dir, rt.rank))
        write_metrics(self.opts.metrics_out, result, rt, checkpoints=self.directory)
        result["model"] = strategy.unwrap(self.model)
        return result


def breakdown_line(run_dir: str, rank: int) -> str:
    """``--breakdown``: where this rank's steady step went, from its step records (observe/reading.py)."""
    stats = rank_stats(rank, list(read_lines(metrics_dir(run_dir) / f"rank-{rank}.jsonl")))
    if stats is None:
        return "Step breakdown: no step recorded"
    parts = ", ".join(
        f"{name} {stats.shares[key] * 1e3:.2f} ms"
        for key, name in (
            ("data", "data"),
            ("compute", "forward"),
            ("backward", "backward"),
            ("comm", "communication exposed"),
            ("optimizer", "optimizer"),
            ("other", "other"),
        )
    )
    return f"Step breakdown (rank {rank}, median step {stats.steady_step_s * 1e3:.2f} ms): {parts}"


def set_aside(directory: Path, rt: Any) -> Path | None:
    """``--fresh``: rank 0 renames an existing checkpoint directory to ``<dir>.before-<date>`` (never
    deleted), between barriers so that no rank looks for checkpoints while it moves."""
    moved = None
    rt.barrier()
    if rt.is_main and directory.is_dir() and any(directory.iterdir()):
        moved = directory.with_name(f"{directory.name}.before-{time.strftime('%Y%m%d-%H%M%S')}")
        n = 1
        while moved.exists():
            moved, n = moved.with_name(f"{moved.name}-{n}"), n + 1
        directory.rename(moved)
        rt.print(f"--fresh: moved the checkpoints in {directory} aside to {moved}; starting from step 0")
    rt.barrier()
    return moved
