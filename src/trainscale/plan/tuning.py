"""`trainscale plan --tune`'s acting part: each trial a short real run (launch/trial.py),
the search driven to its budget, the best and the defaults measured again side by side. The choosing
is plan/tune.py's (pure); the CLI only parses and prints.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainscale.bench.study import BATCH_ENV
from trainscale.errors import ConfigError
from trainscale.launch.trial import WORKLOADS, here
from trainscale.observe.reading import run_timing
from trainscale.plan.tune import Search, Setting, Trial, TuneSpec, gain, knobs, render_config


def measure(spec: TuneSpec, setting: Setting, work: Path, n: int) -> Trial:
    """Run trial ``n`` of ``setting`` (launch/trial.py); its steady throughput from its step records
    (observe/reading.py), or why it failed."""
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("TRAINSCALE_TRAIN_")}
    env.update({"TRAINSCALE_RECORD": "1", "TRAINSCALE_HANG_NOTICE": "0"})
    if spec.script is not None:
        if setting.threads is not None:
            env["OMP_NUM_THREADS"] = str(setting.threads)
        env[BATCH_ENV] = str(setting.batch_size)
        target, module = spec.script, False
        args = [a.replace("{batch}", str(setting.batch_size)) for a in spec.script_args]
    else:
        target, module = WORKLOADS, True
        args = [
            spec.workload,
            *spec.workload_args,
            "--device",
            spec.device,
            "--loader",
            spec.loader,
            "--max-steps",
            str(spec.max_steps),
            "--epochs",
            "1000",
            "--log-every",
            "0",
            *setting.workload_args(spec.strategy),
        ]
        if "--strategy" not in args:
            args += ["--strategy", spec.strategy]
    run_dir = work / f"trial-{n}"
    done = here(target, tuple(args), module=module, nproc=spec.nproc_per_node, run_dir=run_dir, env=env)
    if not done.ok:
        return Trial(setting, None, done.seconds, " / ".join(done.summary.strip().splitlines()[-3:]) or "failed")
    rate = ((run_timing(run_dir) or {}).get("steady") or {}).get("samples_per_s")
    if rate is None:
        return Trial(
            setting,
            None,
            done.seconds,
            "the run recorded no optimizer step with a batch (its step records: docs/observability.md)",
        )
    return Trial(setting, rate, done.seconds)


@dataclass(frozen=True)
class Outcome:
    search: Search
    best: Setting
    default: Setting
    best_rate: float | None
    default_rate: float | None
    budget_reached: bool


def tune(spec: TuneSpec, say: Callable[[str], None]) -> Outcome:
    """The search within ``spec.budget``, each trial said as it ends; the defaults must run."""
    with tempfile.TemporaryDirectory(prefix="trainscale-tune-") as tmp:  # the trials' metrics and logs
        return _search(spec, Search(spec), Path(tmp), say)


def _search(spec: TuneSpec, search: Search, work: Path, say: Callable[[str], None]) -> Outcome:
    started = time.monotonic()
    n, setting = 0, None
    while (setting := search.next()) is not None and (n == 0 or search.time_left(time.monotonic() - started)):
        n += 1
        trial = measure(spec, setting, work, n)
        search.record(trial)
        rate = f"{trial.samples_per_s:.0f} samples/s" if trial.samples_per_s else f"failed: {trial.failure}"
        say(f"  {n:>2}. {setting.describe():<45} {rate}  ({trial.seconds:.0f}s)")
        if n == 1 and not trial.samples_per_s:
            raise ConfigError(
                f"the defaults do not run: {trial.failure}",
                hint="run the same line with `trainscale run` to see the whole error",
            )
    best, default = search.best, search.default
    best_rate = default_rate = search.measured(default)
    if best != default:  # the pair again, one after the other: the gain from one moment of the machine
        default_rate = measure(spec, default, work, n + 1).samples_per_s
        best_rate = measure(spec, best, work, n + 2).samples_per_s
    return Outcome(search, best, default, best_rate, default_rate, budget_reached=setting is not None)


def headline(spec: TuneSpec) -> str:
    """What ``trainscale plan --tune`` says before the first trial."""
    return (
        f"trainscale plan --tune: {spec.workload or spec.script}, {spec.nproc_per_node} rank(s) on {spec.device}, "
        f"budget {spec.budget:.0f}s, {spec.max_steps} steps per trial; knobs: "
        f"{', '.join(k for k, _ in knobs(spec))}"
    )


def check_command(*, workload: str | None, script: str | None, out: Path) -> None:
    """``trainscale plan --tune``'s refusals before a TuneSpec: two targets, a script that is not there, an ``--out``
    that would be overwritten."""
    if script and workload:
        raise ConfigError(f"both --workload {workload} and script {script!r} given", hint="tune one of them")
    if script and not Path(script).is_file():
        raise ConfigError(f"script {script!r} does not exist", hint="give a training script, or --workload NAME")
    if out.exists():
        raise ConfigError(f"{out} already exists: tune does not overwrite it", hint="--out another file, or move it")


def report(spec: TuneSpec, done: Outcome, out: Path) -> list[str]:
    """Write the best setting's config file to ``out``; the lines that say what was found and where it went."""
    best, default = done.best, done.default
    lines = (
        [f"  (budget reached: {len(done.search.trials)} trial(s); raise --budget to search further)"]
        if done.budget_reached
        else []
    )
    if best != default:
        g = gain(done.best_rate, done.default_rate)
        lines.append(
            f"\nbest: {best.describe()}"
            + (
                f"; {g:.2f}x the defaults' throughput ({done.best_rate:.0f} vs "
                f"{done.default_rate:.0f} samples/s, measured again side by side)"
                if g
                else ""
            )
        )
    else:
        lines.append(
            f"\nbest: the defaults ({best.describe()}, {done.default_rate:.0f} samples/s): nothing tried beat "
            "them by more than 3%"
        )
    if best.batch_size != spec.batch_size:
        lines.append(
            f"note: the per-rank batch changed from {spec.batch_size} to {best.batch_size}: the global batch "
            "and the training change with it; scale the learning rate to match"
        )
    out.write_text(
        render_config(spec, best, default_rate=done.default_rate, best_rate=done.best_rate, host=socket.gethostname())
    )
    return lines + [
        f"wrote {out}: trainscale run --nproc-per-node {spec.nproc_per_node} --workload "
        f"{spec.workload or 'NAME'} --config {out}"
    ]
