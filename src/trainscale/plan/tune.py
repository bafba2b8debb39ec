"""`trainscale plan --tune`: which settings make this training fastest here. Pure planning and choosing
(the knobs, a coordinate descent from the defaults, the config file written); ``plan/tuning.py`` launches
the trials. The knobs and the search: docs/scaling.md, "`trainscale plan --tune`".
"""

from __future__ import annotations

import dataclasses
import datetime
from dataclasses import dataclass, field

from trainscale.bench.configs import int_tuple
from trainscale.errors import ConfigError
from trainscale.workloads.registry import get_workload

NOISE = 0.03
"""A change must beat the best so far by more than this fraction to be kept (run-to-run noise)."""
LOADERS = ("tensor", "dataloader")
DEVICES = ("auto", "cpu", "cuda")


@dataclass(frozen=True, kw_only=True)
class Setting:
    """One point of the search; None: the workload's default."""

    batch_size: int
    threads: int | None = None
    num_workers: int | None = None
    bucket_cap_mb: int | None = None
    comm_hook: str | None = None

    def changed(self, knob: str, value) -> Setting:
        return dataclasses.replace(self, **{knob: value})

    def strategy(self, base: str) -> str:
        """``base`` with this setting's DDP options added (``ddp:bucket_cap_mb=5,comm_hook=fp16``)."""
        extra = [
            f"{k}={v}"
            for k, v in (("bucket_cap_mb", self.bucket_cap_mb), ("comm_hook", self.comm_hook))
            if v is not None
        ]
        if not extra:
            return base
        return base + ("," if ":" in base else ":") + ",".join(extra)

    def workload_args(self, base_strategy: str) -> list[str]:
        args = ["--batch-size", str(self.batch_size)]
        args += [
            arg
            for knob in ("threads", "num_workers")
            if getattr(self, knob) is not None
            for arg in (f"--{knob.replace('_', '-')}", str(getattr(self, knob)))
        ]
        strategy = self.strategy(base_strategy)
        if strategy != base_strategy:
            args += ["--strategy", strategy]
        return args

    def describe(self) -> str:
        knobs = dataclasses.asdict(self)
        return ", ".join(
            [
                f"batch {knobs.pop('batch_size')}",
                *(f"{k.replace('_', ' ')} {v}" for k, v in knobs.items() if v is not None),
            ]
        )


@dataclass(frozen=True, kw_only=True)
class TuneSpec:
    """What to tune, where, for how long. ``trainscale plan --tune`` resolves it in the one order (``bench/options.py``:
    a ``[tune]`` table, ``TRAINSCALE_TUNE_<FIELD>``, the command line)."""

    workload: str | None = "cnn"
    """A built-in workload, or None with ``script``."""
    script: str | None = None
    """A training script taking its per-rank batch as ``{batch}`` in ``script_args`` (only batch and threads
    are tuned for a script: the rest are its own business)."""
    script_args: tuple[str, ...] = ()
    workload_args: tuple[str, ...] = ()
    """Further arguments of the workload, kept in every trial."""
    nproc_per_node: int = 1
    """Ranks of every trial, as ``trainscale run``."""
    batch_size: int = 16
    """The default per-rank batch the search starts from."""
    strategy: str = "ddp"
    """The workload's ``--strategy`` for every trial."""
    loader: str = "tensor"
    """The workload's ``--loader``; dataloader also tries DataLoader workers."""
    device: str = "auto"
    """cpu or cuda: what the ranks train on (threads are tuned on CPU ranks only); auto: cuda where a GPU is
    visible."""
    cores: int = 1
    """CPU cores of this machine (threads per rank x ranks never exceed them)."""
    budget: float = 300.0
    """Seconds for the whole search."""
    max_steps: int = 30
    """Optimizer steps per trial."""
    batches: tuple[int, ...] = ()
    """Per-rank batches to try; empty: the default, half, twice and four times it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "batches", int_tuple(self.batches, "--batches"))  # 8,16 or [8, 16]; each >= 1
        for flag, value, choices in (("--loader", self.loader, LOADERS), ("--device", self.device, DEVICES)):
            if value not in choices:
                raise ConfigError(
                    f"{flag} {value!r} is not one of {', '.join(choices)}", hint=f"e.g. {flag} {choices[1]}"
                )
        if self.device == "auto":
            from trainscale.runtime.device import visible_gpu_count  # noqa: PLC0415 (torch-free module)

            object.__setattr__(self, "device", "cuda" if visible_gpu_count() else "cpu")
        if (self.workload is None) == (self.script is None):
            raise ConfigError("tune needs one target: --workload NAME or a SCRIPT", hint="e.g. --workload cnn")
        if self.script is not None and not any("{batch}" in a for a in self.script_args):
            raise ConfigError(
                f"{self.script}: tune sets the per-rank batch through {{batch}} in the script's arguments, "
                "and there is none",
                hint=f"e.g. trainscale plan --tune {self.script} --batch-size {{batch}}",
            )
        if self.budget < 10:
            raise ConfigError(f"--budget {self.budget:g}s is too short for even one trial", hint="e.g. --budget 300")
        if self.max_steps < 5:
            raise ConfigError(f"--max-steps {self.max_steps}: too few steps to time", hint="e.g. --max-steps 30")
        if self.nproc_per_node < 1 or self.batch_size < 1 or self.cores < 1:
            raise ConfigError("ranks, batch and cores must be >= 1", hint="e.g. --nproc-per-node 2 --batch-size 16")
        if self.workload is not None:
            get_workload(self.workload)  # an unknown name is refused here, with the list

    @property
    def ddp(self) -> bool:
        """Whether DDP's bucket and hook options apply: the strategy has them (asked, not named) and there
        are ranks to all-reduce between."""
        from trainscale.strategies import get_strategy  # noqa: PLC0415 (torch-free module)

        fields = {f.name for f in dataclasses.fields(get_strategy(self.strategy))}
        return self.workload is not None and self.nproc_per_node > 1 and {"bucket_cap_mb", "comm_hook"} <= fields


def knobs(spec: TuneSpec) -> list[tuple[str, tuple]]:
    """(knob, the values to try) in search order; the first value of each is the default."""
    b = spec.batch_size
    out: list[tuple[str, tuple]] = [
        ("batch_size", spec.batches or tuple(dict.fromkeys((b, max(1, b // 2), 2 * b, 4 * b))))
    ]
    if spec.device == "cpu":
        per_rank = max(1, spec.cores // spec.nproc_per_node)
        threads = tuple(dict.fromkeys(t for t in (per_rank, 1, 2, 4, 8) if t <= per_rank))
        if len(threads) > 1:
            out.append(("threads", (None, *[t for t in threads if t != per_rank])))
    if spec.workload is not None and spec.loader == "dataloader":
        out.append(("num_workers", (None, 1, 2, 4)))
    if spec.ddp:
        out.append(("bucket_cap_mb", (None, 1, 5, 50)))
        from trainscale.strategies.comm_hooks import HOOKS  # noqa: PLC0415 (torch-free module)

        out.append(("comm_hook", (None, *[h for h in HOOKS if h not in ("auto", "none", "shm")])))
    return out


@dataclass
class Trial:
    setting: Setting
    samples_per_s: float | None
    seconds: float
    failure: str = ""


@dataclass
class Search:
    """The coordinate descent's state: feed it trial results, ask it what to run next."""

    spec: TuneSpec
    trials: list[Trial] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.plan = knobs(self.spec)
        self.default = Setting(batch_size=self.spec.batch_size)
        self.best: Setting = self.default
        self._queue: list[tuple[str, object]] = []
        self._knob = -1

    def measured(self, setting: Setting) -> float | None:
        rates = [t.samples_per_s for t in self.trials if t.setting == setting and t.samples_per_s]
        return max(rates) if rates else None

    def record(self, trial: Trial) -> None:
        self.trials.append(trial)
        best = self.measured(self.best)
        if trial.samples_per_s and (best is None or trial.samples_per_s > best * (1 + NOISE)):
            self.best = trial.setting

    def next(self) -> Setting | None:
        """The next setting to measure (None: the search is done)."""
        if self.measured(self.default) is None and not any(t.setting == self.default for t in self.trials):
            return self.default
        while True:
            while self._queue:
                knob, value = self._queue.pop(0)
                candidate = self.best.changed(knob, value)
                if not any(t.setting == candidate for t in self.trials):
                    return candidate
            self._knob += 1
            if self._knob >= len(self.plan):
                return None
            knob, values = self.plan[self._knob]
            self._queue = [(knob, v) for v in values]

    def time_left(self, elapsed_s: float, reserve: int = 2) -> bool:
        """Whether another trial fits in the budget at the slowest trial's pace so far, keeping room for
        ``reserve`` more (the final measurement of the best and the defaults)."""
        slowest = max((t.seconds for t in self.trials), default=0.0)
        return elapsed_s + (1 + reserve) * slowest <= self.spec.budget


def gain(best_rate: float | None, default_rate: float | None) -> float | None:
    return best_rate / default_rate if best_rate and default_rate else None


def render_config(
    spec: TuneSpec,
    best: Setting,
    *,
    default_rate: float | None,
    best_rate: float | None,
    host: str,
    now: datetime.datetime | None = None,
) -> str:
    """The ``[train]`` table run/slurm/bench take through the workload's ``--config FILE``."""
    now = now or datetime.datetime.now()
    g = gain(best_rate, default_rate)
    lines = [
        f"# trainscale plan --tune, {now:%Y-%m-%d %H:%M} on {host}: {spec.workload or spec.script}, "
        f"{spec.nproc_per_node} rank(s) on {spec.device}",
        f"# defaults {default_rate or 0:.0f} samples/s -> these {best_rate or 0:.0f} samples/s"
        + (f" ({g:.2f}x)" if g else ""),
        "# use: trainscale run --nproc-per-node N --workload NAME --config THIS_FILE (slurm: the same after "
        "--workload; bench: after --)",
    ]
    if best.batch_size != spec.batch_size:
        lines.append(
            f"# the per-rank batch changed from {spec.batch_size}: the global batch changes with it, "
            "scale the learning rate (--lr) to match"
        )
    lines += ["", "[train]", f"batch_size = {best.batch_size}"]
    lines += [f"{knob} = {value}" for knob in ("threads", "num_workers") if (value := getattr(best, knob)) is not None]
    from trainscale.train.options import TrainOptions  # noqa: PLC0415 (torch-free module)

    strategy = best.strategy(spec.strategy)
    if strategy != next(f.default for f in dataclasses.fields(TrainOptions) if f.name == "strategy"):
        lines.append(f'strategy = "{strategy}"')
    return "\n".join(lines) + "\n"
