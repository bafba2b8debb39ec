"""Chaos benchmark: does a run survive what clusters do to it, and end where an undisturbed run ends?

    .venv/bin/python benchmarks/chaos.py --trials 30 [--seed 0] [--keep]

Each trial starts a 2-rank `trainscale run` of a small gpt (checkpointing every few steps), picked at
random among ddp / zero1 / fsdp x synchronous / background saves, and does one of:

- kill-rank:     SIGKILL one rank at a random time; the run has --max-restarts 3 and must finish by itself;
- kill-launcher: SIGKILL the `trainscale run` launcher at a random time; every rank must die with it
                 (no orphan left training), then the same command is run again and must resume;
- damage:        SIGKILL the launcher once two checkpoints exist, damage the newest one at random
                 (truncate, zero-length, one flipped byte, a deleted shard or manifest, or a pickle payload
                 that would `touch` a marker file), run again: it must skip that checkpoint with a
                 warning naming it, resume from the previous one, and never run the payload.

A launcher killed after the run's last save leaves nothing to train: the rerun refuses to train 0 steps
(exit 1, by design: docs/launch.md) and the trial counts as survived when that last checkpoint is the
undisturbed run's, bitwise. Every trial's final checkpoint is compared with an uninterrupted run's of the same configuration:
"bitwise" means every tensor of the model and optimizer state is equal. Prints one line per trial
and: trials, survived, bitwise-equal, orphans, payloads executed.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.damage import DAMAGES, damage  # noqa: E402  (the tests' own damage kinds)

STEPS, EVERY = 40, 5
STRATEGIES = ("ddp", "zero1", "fsdp")
SAVES = ("--checkpoint-async", "--no-checkpoint-async")
KINDS = ("kill-rank", "kill-launcher", "damage")


@dataclass(frozen=True)
class Config:
    strategy: str
    saves: str

    @property
    def name(self) -> str:
        return f"{self.strategy}/{'background' if self.saves == '--checkpoint-async' else 'sync'}"


def command(config: Config, exp: Path, logs: Path, restarts: int) -> list[str]:
    return [sys.executable, "-m", "trainscale", "run", "--nproc-per-node", "2", "--max-restarts", str(restarts),
            "--log-dir", str(logs), "--workload", "gpt", "--n-layer", "1", "--n-embd", "32", "--n-head", "2",
            "--seq-len", "32", "--batch-size", "4", "--max-steps", str(STEPS), "--checkpoint-every", str(EVERY),
            "--log-every", "0", "--experiment-dir", str(exp), "--strategy", config.strategy, config.saves]


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSCALE_")}
    env["TRAINSCALE_RECORD"] = "0"
    return env


def checkpoints(exp: Path) -> list[Path]:
    directory = exp / "checkpoints"
    return sorted(p for p in directory.glob("ckpt-*") if not p.name.endswith((".json", ".tmp"))) \
        if directory.is_dir() else []


def newest_step(exp: Path) -> int:
    found = checkpoints(exp)
    return int(found[-1].name.split("-")[1].split(".")[0]) if found else 0


def final_state(exp: Path) -> dict[str, torch.Tensor]:
    """The model and optimizer tensors of the run's last checkpoint, whole (DCP shards gathered)."""
    last = checkpoints(exp)[-1]
    if last.is_dir():
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        with tempfile.TemporaryDirectory() as tmp:
            dcp_to_torch_save(str(last), f"{tmp}/whole.pt")
            state = torch.load(f"{tmp}/whole.pt", weights_only=False)  # our own file, just written
    else:
        state = torch.load(last, weights_only=True)
    flat: dict[str, torch.Tensor] = {}

    def walk(prefix: str, value) -> None:
        if isinstance(value, torch.Tensor):
            flat[prefix] = value
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(f"{prefix}.{key}", item)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                walk(f"{prefix}.{i}", item)

    walk("model", state["model"])
    walk("optimizer", state["optimizer"])
    return flat


def equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def ranks_of(launcher: psutil.Process) -> list[psutil.Process]:
    try:
        return [p for p in launcher.children(recursive=True) if p.name().startswith("ts-rank")]  # forked workers
    except psutil.Error:
        return []


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def run(argv: list[str], timeout: float = 600) -> tuple[int, str]:
    done = subprocess.run(argv, env=environment(), capture_output=True, text=True, timeout=timeout)
    return done.returncode, done.stdout + done.stderr


def tail(output: str, lines: int = 12) -> str:
    """The end of a failed run's output, indented under its trial's line."""
    return "".join(f"\n       | {line}" for line in output.splitlines()[-lines:])


@dataclass
class Outcome:
    survived: bool
    equal: bool
    orphans: int = 0
    payload_ran: bool = False
    detail: str = ""


def disturbed(kind: str, config: Config, work: Path, rng: random.Random, reference_s: float,
              reference: dict[str, torch.Tensor]) -> Outcome:
    exp, logs = work / "exp", work / "logs"
    restarts = 3 if kind == "kill-rank" else 0
    argv = command(config, exp, logs, restarts)
    proc = subprocess.Popen(argv, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    launcher = psutil.Process(proc.pid)
    detail, orphans, marker = "", 0, work / "payload-ran"
    deadline = time.monotonic() + 300
    if kind == "damage":  # at least two checkpoints: the newest damaged, the one before it intact
        saves = rng.randrange(2, STEPS // EVERY)
        while (len(checkpoints(exp)) < 2 or newest_step(exp) < saves * EVERY) and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.02)
    else:  # a random moment of the training: after a random number of saves (0 to all but the last)
        saves = rng.randrange(0, STEPS // EVERY)
        while (len(ranks_of(launcher)) < 2 or newest_step(exp) < saves * EVERY) and proc.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.3))
    if proc.poll() is not None:
        output = proc.stdout.read()
        return Outcome(proc.returncode == 0, proc.returncode == 0 and equal(final_state(exp), reference),
                       detail="finished before the fault")
    ranks = ranks_of(launcher)
    if kind == "kill-rank" and not ranks:  # the ranks have just ended: the run is finishing by itself
        proc.communicate()
        return Outcome(proc.returncode == 0, proc.returncode == 0 and equal(final_state(exp), reference),
                       detail="finished before the fault")
    if kind == "kill-rank":
        victim = rng.choice(ranks)
        detail = f"SIGKILL rank pid {victim.pid} after step {newest_step(exp)}'s checkpoint"
        victim.send_signal(signal.SIGKILL)
        try:
            output, _ = proc.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            proc.kill()
            return Outcome(False, False, detail=detail + "; the run did not end")
        survived = proc.returncode == 0
        return Outcome(survived, survived and equal(final_state(exp), reference),
                       detail=detail if survived else detail + tail(output))
    launcher.send_signal(signal.SIGKILL)
    proc.wait()
    gone_by = time.monotonic() + 15
    while alive(ranks) and time.monotonic() < gone_by:
        time.sleep(0.05)
    left = alive(ranks)
    orphans = len(left)
    for p in left:
        p.kill()
    detail = (f"SIGKILL launcher after step {newest_step(exp)}'s checkpoint" if checkpoints(exp) else
              "SIGKILL launcher before the first checkpoint") + (f", {orphans} orphan(s)" if orphans else "")
    if kind == "damage":
        newest = checkpoints(exp)[-1]
        how = rng.choice(DAMAGES)
        changed = damage(newest, how, marker=marker)
        detail += f"; {how} {changed.relative_to(exp)}"
    code, output = run(argv)
    survived = code == 0
    last = checkpoints(exp)[-1] if checkpoints(exp) else None
    if not survived and "resuming would train nothing" in output and last is not None and \
            last.name.startswith(f"ckpt-{STEPS:08d}"):
        # killed after its last save: the work was done, and the rerun says so and changes nothing (exit 1)
        survived, detail = True, detail + "; it had saved its last step: the rerun refused to train nothing"
    elif not survived:
        detail += tail(output)
    if kind == "damage" and survived and "skipping checkpoint" not in output.lower() and newest.name not in output:
        detail += "; no warning named the damaged checkpoint"
    return Outcome(survived, survived and equal(final_state(exp), reference), orphans, marker.exists(), detail)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", action="store_true", help="keep the trials' directories")
    ns = p.parse_args()
    rng = random.Random(ns.seed)
    root = Path(tempfile.mkdtemp(prefix="trainscale-chaos-"))
    references: dict[Config, tuple[float, dict]] = {}
    rows = []
    for trial in range(1, ns.trials + 1):
        config = Config(rng.choice(STRATEGIES), rng.choice(SAVES))
        kind = KINDS[(trial - 1) % len(KINDS)]  # each kind a third of the trials, configurations at random
        if config not in references:
            ref = root / f"reference-{config.strategy}-{config.saves.strip('-')}"
            started = time.monotonic()
            code, output = run(command(config, ref / "exp", ref / "logs", 0))
            if code != 0:
                print(output)
                raise SystemExit(f"the uninterrupted {config.name} run failed")
            references[config] = (time.monotonic() - started, final_state(ref / "exp"))
        work = root / f"trial-{trial:03d}"
        started = time.monotonic()
        outcome = disturbed(kind, config, work, rng, *references[config])
        rows.append((trial, kind, config, outcome, time.monotonic() - started))
        print(f"{trial:>3}  {kind:<13} {config.name:<16} survived={outcome.survived!s:<5} "
              f"bitwise={outcome.equal!s:<5} {time.monotonic() - started:5.1f}s  {outcome.detail}", flush=True)
        if not ns.keep and outcome.survived and outcome.equal:  # a failed trial's directory stays, to read
            shutil.rmtree(work, ignore_errors=True)
    n = len(rows)
    injected = sum(r[3].detail != "finished before the fault" for r in rows)
    survived = sum(r[3].survived for r in rows)
    equal_ = sum(r[3].equal for r in rows)
    orphans = sum(r[3].orphans for r in rows)
    payloads = sum(r[3].payload_ran for r in rows)
    print(f"\ntrials {n} ({injected} with a fault injected; the others ended before it), "
          f"survived {survived} ({survived / n:.0%}), bitwise-equal {equal_} ({equal_ / n:.0%}), "
          f"orphaned ranks {orphans}, payloads executed {payloads}")
    failed = [r for r in rows if not (r[3].survived and r[3].equal)]
    if failed:
        print(f"failed trials' directories: {root}")
    elif not ns.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if survived == equal_ == n and not orphans and not payloads else 1


if __name__ == "__main__":
    raise SystemExit(main())
