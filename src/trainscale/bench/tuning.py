"""`trainscale tune`'s acting part: each trial a short real run launched as ``trainscale run`` launches it,
the search driven to its budget, the best and the defaults measured again side by side. The choosing
is bench/tune.py's (pure); the CLI only parses and prints.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from trainscale.bench.tune import Search, Setting, Trial, TuneSpec
from trainscale.errors import ConfigError


def trial_command(spec: TuneSpec, setting: Setting, metrics: Path, log_dir: Path) -> tuple[list[str], dict[str, str]]:
    """The `trainscale run` line of one trial and its environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINSCALE_TRAIN_",))}
    env["TRAINSCALE_RECORD"] = "0"  # a trial measures the training, not the recording
    head = [sys.executable, "-m", "trainscale", "run", "--nproc-per-node", str(spec.nproc_per_node),
            "--log-dir", str(log_dir)]
    if spec.script is not None:
        from trainscale.bench.study import BATCH_ENV, METRICS_ENV

        if setting.threads is not None:
            env["OMP_NUM_THREADS"] = str(setting.threads)
        env.update({METRICS_ENV: str(metrics), BATCH_ENV: str(setting.batch_size)})
        args = [a.replace("{batch}", str(setting.batch_size)) for a in spec.script_args]
        return [*head, spec.script, *args], env
    args = [*spec.workload_args, "--device", spec.device, "--loader", spec.loader, "--max-steps", str(spec.max_steps),
            "--epochs", "1000", "--log-every", "0", "--metrics-out", str(metrics), *setting.workload_args(spec.strategy)]
    if "--strategy" not in args:
        args += ["--strategy", spec.strategy]
    return [*head, "--workload", spec.workload, *args], env


def measure(spec: TuneSpec, setting: Setting, work: Path, n: int) -> Trial:
    """Run trial ``n`` of ``setting``; its throughput as the run measured it, or why it failed."""
    metrics = work / f"trial-{n}.json"
    argv, env = trial_command(spec, setting, metrics, work / "logs")
    started = time.monotonic()
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return Trial(setting, None, seconds, " / ".join(tail) or f"exit {done.returncode}")
    if not metrics.exists():
        return Trial(setting, None, seconds, "the run wrote no metrics (a script reports through "
                                             "trainscale.bench.metrics.EpochRecorder, as for trainscale bench)")
    epochs = json.loads(metrics.read_text()).get("epochs") or []
    samples = sum(e["samples_per_s"] * e["time_s"] for e in epochs)
    elapsed = sum(e["time_s"] for e in epochs)
    return Trial(setting, samples / elapsed if elapsed else None, seconds)


@dataclass(frozen=True)
class Outcome:
    search: Search
    best: Setting
    default: Setting
    best_rate: float | None
    default_rate: float | None
    budget_reached: bool


def tune(spec: TuneSpec, say: Callable[[str], None]) -> Outcome:
    """The search within ``spec.budget_s``, each trial said as it ends; the defaults must run."""
    search = Search(spec)
    work = Path(tempfile.mkdtemp(prefix="trainscale-tune-"))
    started = time.monotonic()
    n, setting = 0, None
    while (setting := search.next()) is not None and (n == 0 or search.time_left(time.monotonic() - started)):
        n += 1
        trial = measure(spec, setting, work, n)
        search.record(trial)
        rate = f"{trial.samples_per_s:.0f} samples/s" if trial.samples_per_s else f"failed: {trial.failure}"
        say(f"  {n:>2}. {setting.describe():<45} {rate}  ({trial.seconds:.0f}s)")
        if n == 1 and not trial.samples_per_s:
            raise ConfigError(f"the defaults do not run: {trial.failure}",
                              hint="run the same line with `trainscale run` to see the whole error")
    best, default = search.best, search.default
    best_rate = default_rate = search.measured(default)
    if best != default:  # the pair again, one after the other: the gain from one moment of the machine
        default_rate = measure(spec, default, work, n + 1).samples_per_s
        best_rate = measure(spec, best, work, n + 2).samples_per_s
    return Outcome(search, best, default, best_rate, default_rate, budget_reached=setting is not None)
