"""`trainscale tune`: search per-rank batch, threads, DataLoader workers, DDP buckets and gradient compression
for a workload or script within a time budget; print the best with its gain and write it as a config file."""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trainscale.errors import ConfigError

USAGE = """trainscale tune [--workload NAME | SCRIPT [ARGS...]] [--nproc-per-node N] [--batch-size B]
                       [--batches 8,16,32] [--budget SECONDS] [--max-steps S] [--strategy S] [--loader L]
                       [--out FILE] [-- WORKLOAD ARGS...]"""
DESCRIPTION = """Each trial is a short real run (--max-steps steps) launched like `trainscale run`; the search changes one
knob at a time from the defaults (per-rank batch, threads per CPU rank, DataLoader workers with
--loader dataloader, DDP bucket size and gradient compression with 2+ DDP ranks) and keeps a value only
when it is faster by more than 3%. The best and the defaults are measured once more at the end; the gain
printed is from that pair. The result is a [train] table (default tuned.toml) that run, slurm and bench
pass to the workload with --config.

Examples:
  trainscale tune --workload cnn --nproc-per-node 2 --budget 300
  trainscale tune --workload cnn --loader dataloader --batches 16,32,64 --budget 600 --out cnn.toml
  trainscale tune train.py --batch-size {batch} --nproc-per-node 2
  trainscale run --nproc-per-node 2 --workload cnn --config tuned.toml
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainscale tune", usage=USAGE, description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", default=None, help="a built-in workload to tune (`trainscale workloads`); or give "
                                                    "SCRIPT [ARGS...] with {batch} where the per-rank batch goes")
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, default=1,
                   help="ranks of every trial, as `trainscale run` (default: 1)")
    p.add_argument("--batch-size", type=int, default=16, help="the default per-rank batch to start from (default: 16)")
    p.add_argument("--batches", default=None, help="per-rank batches to try (default: B/2, B, 2B, 4B)")
    p.add_argument("--budget", type=float, default=300.0, help="seconds for the whole search (default: 300)")
    p.add_argument("--max-steps", type=int, default=30, help="optimizer steps per trial (default: 30)")
    p.add_argument("--strategy", default="ddp", help="the workload's --strategy for every trial (default: ddp)")
    p.add_argument("--loader", default="tensor", choices=("tensor", "dataloader"),
                   help="the workload's --loader; dataloader also tries DataLoader workers (default: tensor)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="the workload's --device (default: auto)")
    p.add_argument("--out", default="tuned.toml", help="the [train] config file written (default: tuned.toml)")
    return p


def build(argv: list[str]):
    from trainscale.bench.configs import parse_int_list
    from trainscale.bench.tune import TuneSpec
    from trainscale.cli.split import split_command

    split = split_command(_parser(), argv, double_dash="rest")
    ns = _parser().parse_args(split.options)
    script, script_args, workload_args = (split.target, split.rest, []) if split.target else (None, [], split.rest)
    if script and ns.workload:
        raise ConfigError(f"both --workload {ns.workload} and script {script!r} given", hint="tune one of them")
    if script and not Path(script).is_file():
        raise ConfigError(f"script {script!r} does not exist", hint="give a training script, or --workload NAME")
    out = Path(ns.out)
    if out.exists():
        raise ConfigError(f"{out} already exists: tune does not overwrite it", hint="--out another file, or move it")
    device = ns.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    spec = TuneSpec(workload=None if script else (ns.workload or "cnn"), script=script, script_args=tuple(script_args),
                    workload_args=tuple(workload_args), nproc_per_node=ns.nproc_per_node, batch_size=ns.batch_size,
                    strategy=ns.strategy, loader=ns.loader, device=device, cores=os.cpu_count() or 1,
                    budget_s=ns.budget, max_steps=ns.max_steps,
                    batches=parse_int_list(ns.batches, "--batches") if ns.batches else ())
    if script is None:
        from trainscale.workloads.registry import get_workload

        get_workload(spec.workload)  # an unknown name is refused here, with the list
    return spec, out


def trial_command(spec, setting, metrics: Path, log_dir: Path) -> tuple[list[str], dict[str, str]]:
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


def measure(spec, setting, work: Path, n: int) -> "Trial":
    from trainscale.bench.tune import Trial

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
    data = json.loads(metrics.read_text())
    epochs = data.get("epochs") or []
    samples = sum(e["samples_per_s"] * e["time_s"] for e in epochs)
    elapsed = sum(e["time_s"] for e in epochs)
    return Trial(setting, samples / elapsed if elapsed else None, seconds)


def run(args: argparse.Namespace) -> int:
    from trainscale.bench.tune import Search, gain, render_config

    argv = list(args.argv)
    if argv and argv[0] in ("-h", "--help"):
        _parser().print_help()
        return 0
    spec, out = build(argv)
    search = Search(spec)
    work = Path(tempfile.mkdtemp(prefix="trainscale-tune-"))
    started = time.monotonic()
    print(f"trainscale tune: {spec.workload or spec.script}, {spec.nproc_per_node} rank(s) on {spec.device}, "
          f"budget {spec.budget_s:.0f}s, {spec.max_steps} steps per trial; knobs: "
          f"{', '.join(k for k, _ in search.plan)}", flush=True)
    n = 0
    while (setting := search.next()) is not None and (n == 0 or search.time_left(time.monotonic() - started)):
        n += 1
        trial = measure(spec, setting, work, n)
        search.record(trial)
        rate = f"{trial.samples_per_s:.0f} samples/s" if trial.samples_per_s else f"failed: {trial.failure}"
        print(f"  {n:>2}. {setting.describe():<45} {rate}  ({trial.seconds:.0f}s)", flush=True)
        if n == 1 and not trial.samples_per_s:
            raise ConfigError(f"the defaults do not run: {trial.failure}",
                              hint="run the same line with `trainscale run` to see the whole error")
    if setting is not None:
        print(f"  (budget reached: {len(search.trials)} trial(s); raise --budget to search further)")
    best, default = search.best, search.default
    best_rate = default_rate = search.measured(default)
    if best != default:  # the pair again, one after the other: the gain from one moment of the machine
        default_rate = measure(spec, default, work, n + 1).samples_per_s
        best_rate = measure(spec, best, work, n + 2).samples_per_s
        g = gain(best_rate, default_rate)
        print(f"\nbest: {best.describe()}" + (f"; {g:.2f}x the defaults' throughput ({best_rate:.0f} vs "
                                                 f"{default_rate:.0f} samples/s, measured again side by side)"
                                                 if g else ""))
    else:
        print(f"\nbest: the defaults ({best.describe()}, {default_rate:.0f} samples/s): nothing tried beat them by "
              "more than 3%")
    if best.batch_size != spec.batch_size:
        print(f"note: the per-rank batch changed from {spec.batch_size} to {best.batch_size}: the global batch and "
              "the training change with it; scale the learning rate to match")
    out.write_text(render_config(spec, best, default_rate=default_rate, best_rate=best_rate,
                                 host=socket.gethostname()))
    print(f"wrote {out}: trainscale run --nproc-per-node {spec.nproc_per_node} --workload "
          f"{spec.workload or 'NAME'} --config {out}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("tune", help="search batch, threads, workers, DDP buckets and compression within a budget",
                       add_help=False)
    p.set_defaults(func=run)


def run_raw(args: argparse.Namespace) -> int:
    return run(args)
