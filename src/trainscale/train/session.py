"""The simple path: what ``trainscale.init()`` returns, a Runtime that also sets up a model for a strategy.

    with trainscale.init(seed=0) as rt:
        model = MyModel()
        model, opt = rt.setup(model, torch.optim.AdamW(model.parameters(), lr=1e-3), strategy="fsdp")
        for x, y in loader:
            loss = loss_fn(model(x.to(rt.device)), y.to(rt.device))
            rt.backward(loss)
            opt.step()
            opt.zero_grad()

As short as Lightning Fabric's, and what trainscale adds stays: detection of the launch, the device,
the process group, seeds, ``rt.guard`` against hangs, checkpoints that resume on any world size.
``rt.log({"loss": ...}, step=...)`` feeds the trackers chosen with ``trainscale.init(trackers=...)``
(train/trackers.py); ``rt.resume(model, opt)`` and ``rt.checkpoint(step, model, opt, every=N)`` make a script
resumable, after a crash, a restart or a SLURM requeue (train/resumable.py).
Gradient accumulation: ``with rt.no_sync(model, enabled=not last):`` around the accumulating
micro-batches (DeepSpeed accumulates by itself: give ``accumulation=`` to setup and step every micro-batch).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainscale.checkpoint import ModelState
from trainscale.errors import ConfigError, did_you_mean, succeeded
from trainscale.launch import rundir
from trainscale.launch.rundir import write_record
from trainscale.observe import hooks
from trainscale.observe.state import PLAN_ALONE_VAR
from trainscale.runtime.runtime import Runtime
from trainscale.runtime.runtime import init as init_runtime
from trainscale.strategies import get_strategy
from trainscale.strategies.base import OptimizerSource, Strategy
from trainscale.strategies.handout import inner
from trainscale.train.resumable import Resumable
from trainscale.train.trackers import Trackers, command_options, parse_trackers


@dataclass(kw_only=True)
class Session(Runtime):
    """A :class:`~trainscale.runtime.Runtime` with ``setup``/``backward``/``no_sync`` for the models it set up."""

    _setups: list[tuple[nn.Module, Strategy]] = field(default_factory=list)
    _tracker_names: tuple[str, ...] | None = None
    _trackers: Any = None
    _log_step: int = 0
    _resumable: Any = None
    _tracker_dir: Path | None = None
    _own_run: Path | None = None
    """The run directory this process made itself (no launcher gave one): its run.json's outcome is written at close."""
    _started: float = field(default_factory=time.monotonic)

    def setup(
        self,
        model: nn.Module,
        optimizer: OptimizerSource,
        *,
        strategy: str | Strategy = "ddp",
        micro_batch_size: int | None = None,
        accumulation: int | None = None,
    ) -> tuple[nn.Module, Any]:
        """``model`` moved to this rank's device and wrapped for ``strategy`` ("ddp", "zero1", "fsdp",
        "deepspeed", or "name:key=value,..."), and its optimizer: pass a ready one (built on
        ``model.parameters()``, parameter groups included) or a factory. ``micro_batch_size`` and
        ``accumulation``: DeepSpeed's config needs them (the per-rank batch, micro-batches per step)."""
        chosen = get_strategy(strategy)
        if not self.is_distributed and os.environ.get(PLAN_ALONE_VAR) == "1":  # plan's calibration of its pace
            alone = {"replicate_alone", "shard_alone"} & {f.name for f in dataclasses.fields(chosen)}
            chosen = dataclasses.replace(chosen, **dict.fromkeys(alone, True))
        recorder = hooks.current()
        if recorder is not None:  # what the script asked for, in its records (plan calibrates it alone too)
            recorder.meta.setdefault("setup", chosen.name)
            if getattr(chosen, "comm_hook", None):  # what its DDP averages with: what plan measures for it
                recorder.meta.setdefault("setup_hook", chosen.comm_hook)
        if micro_batch_size is not None:
            chosen = chosen.with_batch(micro_batch_size, accumulation)
        wrapped, opt = chosen.wrap(model, optimizer, self)
        self._setups.append((wrapped, chosen))
        return wrapped, chosen.user_optimizer(opt, wrapped)

    def backward(self, loss: torch.Tensor, model: nn.Module | None = None) -> None:
        """``loss.backward()`` the strategy's way (loss scaling, DeepSpeed's engine)."""
        wrapped, strategy = self._find(model)
        strategy.backward_loss(loss, wrapped)

    @contextlib.contextmanager
    def no_sync(self, model: nn.Module | None = None, enabled: bool = True) -> Iterator[None]:
        """Skip the gradient synchronisation inside (accumulating micro-batches), when ``enabled``."""
        wrapped, strategy = self._find(model)
        with strategy.accumulate(wrapped, last=not enabled):
            yield

    def unwrap(self, model: nn.Module | None = None) -> nn.Module:
        """The module you passed to setup, inside any wrapper."""
        wrapped, strategy = self._find(model)
        return strategy.unwrap(wrapped)

    def checkpoint_state(self, model: nn.Module, optimizer: Any) -> ModelState:
        """The model's and optimizer's entry for a Checkpointer (saved and restored the strategy's way)."""
        wrapped, strategy = self._find(model)
        return strategy.checkpoint_state(wrapped, inner(optimizer))

    # -- metrics: one call, every tracker ----------------------------------------------------------
    def use_trackers(
        self,
        trackers: str | Iterable[str],
        *,
        directory: str | Path | None = None,
        name: str | None = None,
        run_id: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        """Send :meth:`log`'s values to ``trackers`` (tensorboard, wandb, mlflow, csv), written by rank 0 in
        ``directory`` (default: the run directory of ``trainscale run``/``slurm``, else
        ``trainscale-runs/<script>-<date>-<time>``); rank 0 says once where each one writes. Every rank calls it.
        ``config``: the run's hyperparameters, each tracker's own way (default: the script's ``--name value``
        options, each its own, the command line and the world size: what a script's run is known by)."""
        names = parse_trackers(trackers)
        self._close_trackers()
        self._tracker_names = names
        if self.is_main and names:
            where = Path(directory) if directory is not None else default_run_dir(self)
            if config is None:  # the script's options, each a parameter of its own, and what ran it
                config = {
                    **command_options(sys.argv[1:]),
                    "command": " ".join(sys.argv),
                    "world_size": self.world_size,
                    "device": str(self.device),
                }
            self._trackers = Trackers(names, where, name=name, run_id=run_id, config=config)
            self.print(f"trainscale: metrics go to {where}: {self._trackers.describe()}")

    def log(
        self, values: Mapping[str, Any], *, step: int | None = None, reduce: str | None = None, at: float | None = None
    ) -> None:
        """Write scalar metrics to every tracker chosen (a CSV file in the run directory when none was).

        Rank 0's values are written and the other ranks' ignored, unless ``reduce`` ("mean", "sum", "max",
        "min") combines every rank's first: then it is a collective, called by every rank with the same
        keys. ``step``: the x axis (default: one more than the last call's); ``at``: when the values were measured
        (seconds since the epoch, default now)."""
        if reduce is not None:
            values = self._reduce(values, reduce)
        if step is None:
            step = self._log_step
        self._log_step = step + 1
        if not self.is_main:
            return
        if self._tracker_names is None:  # nothing chosen: a CSV file, so rt.log never drops values silently
            self.use_trackers(("csv",))
        if self._trackers is not None:
            self._trackers.log(values, step, at)

    def _reduce(self, values: Mapping[str, Any], how: str) -> dict[str, float]:
        ops = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        if how not in ops:
            raise ConfigError(f"rt.log(reduce={how!r}) unknown", hint=did_you_mean(str(how), tuple(ops)))
        keys = sorted(values)  # the same order on every rank
        dtype = torch.float32 if self.uses_nccl else torch.float64
        tensor = (
            torch.stack([torch.as_tensor(values[k]).detach().to(self.device, dtype).reshape(()) for k in keys])
            if keys
            else torch.zeros(0, dtype=dtype, device=self.device)
        )
        if self.is_distributed:
            dist.all_reduce(tensor, op=ops[how])
            if how == "mean":
                tensor /= self.world_size
        return dict(zip(keys, tensor.tolist()))

    def _close_trackers(self) -> None:
        trackers, self._trackers = self._trackers, None
        if trackers is not None:
            trackers.close()

    # -- resumable scripts ------------------------------------------------------------------------
    def resume(self, model: nn.Module, optimizer: Any, *, directory: str | Path | None = None, **state: Any) -> int:
        """Restore ``model``, ``optimizer``, the RNGs and any ``state`` entries with state_dict/load_state_dict
        (an LR scheduler, trainscale's loaders) from the newest checkpoint; returns its step, 0 when there is
        none. Also arms SLURM's warning signal for :meth:`checkpoint`. Every rank calls it."""
        self._resumable = self._resumable or Resumable(self, directory)
        return self._resumable.resume(model, optimizer, state)

    def checkpoint(
        self,
        step: int,
        model: nn.Module,
        optimizer: Any,
        *,
        every: int = 1,
        directory: str | Path | None = None,
        **state: Any,
    ) -> None:
        """Save a checkpoint at ``step`` when it is a multiple of ``every``, and whenever SLURM's warning
        signal came: then, once it is saved, the job requeues (``--requeue``) or stops for the chain's next link
        (``--chain``) and this process ends. Every rank calls it at every step (or at every epoch)."""
        self._resumable = self._resumable or Resumable(self, directory)
        self._resumable.checkpoint(step, model, optimizer, state, every=every)

    def close(self, synchronize: bool = True) -> None:
        resumed = self._resumable is not None and self._resumable.resumed is not None
        if self._resumable is not None:
            self._resumable.close(ended_well=synchronize)  # a run that raised is not told to move its checkpoints
        self._close_trackers()
        if self._own_run is not None:
            run, self._own_run = self._own_run, None
            exc = sys.exc_info()[1]  # closed by the with block's end: the exception it ends with, if any
            ok = exc is None or (isinstance(exc, SystemExit) and succeeded(exc))
            trained = {"trained": False} if resumed and not self._resumable.steps else {}  # resumed past its end
            write_record(
                run,
                ok=ok,
                seconds=round(time.monotonic() - self._started, 3),
                **(trained if ok else {"failure": [f"{type(exc).__name__}: {exc}".splitlines()[0]]}),
            )
        super().close(synchronize=synchronize)

    def strategy_of(self, model: nn.Module | None = None) -> Strategy:
        return self._find(model)[1]

    def _find(self, model: nn.Module | None) -> tuple[nn.Module, Strategy]:
        if not self._setups:
            raise ConfigError(
                "no model was set up on this runtime",
                hint="model, opt = rt.setup(model, optimizer, strategy='ddp') first",
            )
        if model is None:
            if len(self._setups) > 1:
                raise ConfigError(
                    f"{len(self._setups)} models were set up: which one?",
                    hint="pass the model, e.g. rt.backward(loss, model)",
                )
            return self._setups[0]
        for wrapped, strategy in self._setups:
            if model is wrapped:
                return wrapped, strategy
        raise ConfigError(
            "this model was not set up on this runtime",
            hint="pass the model rt.setup returned, not the one you gave it",
        )


def init(*, trackers: str | Iterable[str] | None = None, run_dir: str | Path | None = None, **kwargs: Any) -> Session:
    """``trainscale.init``: :func:`trainscale.runtime.init` (same arguments), returning a :class:`Session`.

    ``trackers``: where :meth:`Session.log` writes ("tensorboard", "wandb", "mlflow", "csv", or a comma list);
    ``run_dir``: the directory they write in (default: the run's, see :meth:`Session.use_trackers`)."""
    runtime = init_runtime(**kwargs)
    session = Session(**{f.name: getattr(runtime, f.name) for f in dataclasses.fields(Runtime)})
    session._tracker_dir = Path(run_dir) if run_dir is not None else None
    if trackers is not None:
        try:
            session.use_trackers(trackers)
        except BaseException:
            session.close(synchronize=False)
            raise
    return session


def default_run_dir(rt: Session) -> Path:
    """The run directory ``trainscale run`` and ``trainscale slurm`` give the ranks, else a run directory of its
    own (a plain ``python train.py``), made as `trainscale run` makes its runs: ``trainscale-runs/<script>-<date>-
    <time>`` with ``latest`` pointing at it and a run.json saying what ran (its outcome added at
    :meth:`Session.close`)."""
    if rt._tracker_dir is not None:
        return rt._tracker_dir
    if rt.env.run_dir:
        return Path(rt.env.run_dir)
    rt._tracker_dir = rt._own_run = rundir.create(rundir.DEFAULT_ROOT, Path(sys.argv[0]).stem or "run")
    command = [Path(sys.executable).name, *sys.argv] if rt.env.source == "single" else None
    rundir.start_record(
        rt._own_run,
        target=sys.argv[0],
        args=tuple(sys.argv[1:]),
        module=False,
        no_python=False,
        nproc_per_node=rt.local_world_size,
        nnodes=str(rt.num_nodes),
        max_restarts=0,
        records=rt._own_run.absolute(),
        command=command,
    )
    return rt._own_run
