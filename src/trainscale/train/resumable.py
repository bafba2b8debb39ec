"""Any script resumable in four lines, over the Checkpointer the built-in workloads use:

    start = rt.resume(model, optimizer)                        # the newest checkpoint's step; 0 on a fresh start
    for step in range(start, steps):
        ...                                                    # one training step
        rt.checkpoint(step + 1, model, optimizer, every=100)   # also on SLURM's warning: save, requeue, exit

Where checkpoints go: ``directory=`` when given; in a job of ``trainscale slurm`` the run directory's
``checkpoints/`` (it outlives requeues and chain links, as the built-in workloads' do); else ``./checkpoints``,
so running the same command again resumes. What is saved: the model and optimizer the strategy's way
(``rt.checkpoint_state``), the RNGs, the step and every extra ``name=obj`` with state_dict/load_state_dict.
"""

from __future__ import annotations

import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from torch.optim.optimizer import register_optimizer_step_post_hook

from trainscale.checkpoint import Checkpointer, RNGState
from trainscale.errors import ConfigError

STEP, UNIT = "step", "unit"
"""The checkpoint's counter, and what it counts: ``step`` (an optimizer step each) or ``epoch`` (more steps each)."""


CHECKPOINT_DIR_VAR = "TRAINSCALE_CHECKPOINT_DIR"
"""Where rt.checkpoint/rt.resume keep a run's checkpoints when the script names none (``trainscale plan``'s
calibration points it at a directory of its own: it must neither resume from nor write into the run's)."""


def default_directory(rt: Any) -> Path:
    if os.environ.get(CHECKPOINT_DIR_VAR):
        return Path(os.environ[CHECKPOINT_DIR_VAR])
    if rt.env.job_dir and rt.env.run_dir:  # a trainscale SLURM job: what requeues and chain links share
        return Path(rt.env.run_dir) / "checkpoints"
    return Path("checkpoints")


class Resumable:
    """The Checkpointer and the preemption flag behind ``rt.resume`` and ``rt.checkpoint``."""

    def __init__(self, rt: Any, directory: str | Path | None) -> None:
        self.rt = rt
        self.directory = Path(directory) if directory is not None else default_directory(rt)
        self.checkpointer: Checkpointer | None = None
        self.resumed: tuple[Path, int] | None = None
        """(checkpoint, step) this run resumed from; with no optimizer step after it, the run trained nothing."""
        self.steps: Counter[int] = Counter()
        """Each optimizer's steps since :meth:`resume`, by torch's global hook (any optimizer's, whoever calls it;
        a wrapping optimizer and the one it wraps step once each: the most of them is the run's steps)."""
        self._counting: Any = register_optimizer_step_post_hook(lambda opt, *_: self.steps.update((id(opt),)))
        self.unit = "step"
        self._last = (0, 0)
        """The counter at the last rt.resume/rt.checkpoint, and the optimizer steps then."""
        # From here on SLURM's warning signal only sets a flag, read at the next rt.checkpoint.
        self.preemption = rt.handle_preemption()

    def _entries(self, model: Any, optimizer: Any, state: dict[str, Any]) -> dict[str, Any]:
        clash = sorted({"model", "optimizer", "rng", STEP} & set(state))
        if clash:
            raise ConfigError(
                f"rt.resume/rt.checkpoint: {clash} are trainscale's own checkpoint entries",
                hint="give your extra entries other names, e.g. scheduler=..., loader=...",
            )
        if self.checkpointer is None:
            self.checkpointer = Checkpointer(self.directory, self.rt, strategy=self.rt.strategy_of(model))
            self.preemption.save_seconds = self.checkpointer.save_seconds  # the last save timed before the limit
        return {"model": self.rt.checkpoint_state(model, optimizer), "rng": RNGState(self.rt.device), **state}

    def resume(self, model: Any, optimizer: Any, state: dict[str, Any]) -> int:
        entries = self._entries(model, optimizer, state)
        found = self.checkpointer.restore(entries)
        if found is None:
            self.rt.print(f"trainscale: no checkpoint in {self.directory} yet: starting at step 0")
            return 0
        step = int(found.contents.get(STEP, found.step))
        self.unit = str(found.contents.get(UNIT, "step"))
        self.rt.print(f"trainscale: resumed from {found.path} at {self.unit} {step}")
        self.steps, self._last, self.resumed = Counter(), (step, 0), (Path(found.path), step)
        return step

    def close(self, ended_well: bool = True) -> None:
        """Say so when this run resumed and then trained nothing (a finished run started again: its checkpoints
        already hold the last step, so the loop had nothing left)."""
        if self._counting is not None:
            self._counting.remove()
            self._counting = None
        if self.resumed and not self.steps and ended_well:
            path, step = self.resumed
            self.rt.print(
                f"trainscale: warning: this run resumed from {path} at {self.unit} {step} and trained "
                f"nothing: the loop had no {self.unit} left\n  hint: to train anew, move the checkpoint directory "
                f"{self.directory} aside (it is the run's default: ./checkpoints, or the job's run directory)"
            )

    def checkpoint(self, step: int, model: Any, optimizer: Any, state: dict[str, Any], *, every: int) -> None:
        if every < 1:
            raise ConfigError(f"rt.checkpoint(every={every}) must be >= 1", hint="e.g. every=100 (steps)")
        (counter, steps), now = self._last, max(self.steps.values(), default=0)
        # epochs: the counter moved by one while the optimizer stepped more than twice (a step counter moves with
        # each step; an engine that steps an inner optimizer too, DeepSpeed's, may count two a step)
        if step - counter == 1 and now - steps > 2:
            self.unit = "epoch"
        self._last = (step, now)
        stop = self.preemption.requested()  # agreed across ranks: all save the same step
        if step % every and not stop:
            return
        entries = self._entries(model, optimizer, state)
        self.checkpointer.save(step, {**entries, STEP: step, UNIT: self.unit})
        if not stop:
            return
        head = (
            f"trainscale: preempted ({self.preemption.received or 'signal on another rank'}) at {self.unit} {step}: "
            f"checkpoint saved to {self.directory}"
        )
        self.preemption.requeue_and_log(head, self.rt.print)
        self.rt.close()
        sys.exit(0)  # the job continues in its requeued run or the chain's next link, from this checkpoint
