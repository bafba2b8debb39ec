"""Chaos benchmark: does a run survive what clusters and people do to it, and end where an undisturbed run ends?

    .venv/bin/python benchmarks/chaos.py --trials 36 [--seed 0] [--keep]

Each trial starts a 2-rank `trainscale run` of a small gpt (checkpointing every few steps), picked at
random among ddp / zero1 / fsdp x synchronous / background saves, and does one of:

- kill-rank:     SIGKILL one rank at a random moment of the training; the run has --max-restarts 3 and must
                 finish by itself;
- kill-launcher: SIGKILL the `trainscale run` launcher at a random moment; every rank must die with it (no orphan
                 left training: how long the last one took is reported), then the same command is run again and
                 must resume;
- damage:        SIGKILL the launcher at a random moment once two checkpoints exist, damage the newest one at random
                 (truncate, zero-length, one flipped byte, a deleted shard or manifest, or a pickle payload that
                 would `touch` a marker file), run again: it must skip that checkpoint with a warning naming it,
                 resume from the previous one, and never run the payload;
- craft:         the same with a crafted checkpoint of allow-listed types (an index entry outside the checkpoint or
                 of 2^40 bytes, a tensor 4 bytes off with the manifest re-sealed, a link named for another step);
- two-runs:      the same command started again while the run trains (a requeue beside the running job, a command
                 pasted twice): the second must be refused naming the first, which must finish untouched;
- user-loader:   a plain script of the user's (DistributedLoader, rt.resume, rt.checkpoint every 5 steps) whose
                 launcher is SIGKILLed at a random moment: run again, every sample of every epoch must have been
                 trained on exactly once (its sample-id log), and its weights must be an uninterrupted run's.

A random moment is a uniform draw over the undisturbed run's own duration, so faults land before the first save,
between saves and after the last one alike: the summary says how many landed after the last save. A launcher
killed after the run's last save leaves nothing to train: the rerun refuses to train 0 steps (exit 1, by design:
docs/launch.md) and the trial counts as survived when that last checkpoint is the undisturbed run's, bitwise.
Every trial's final checkpoint is compared with an uninterrupted run's of the same configuration: "bitwise"
means every tensor of the model and optimizer state is equal. Prints one line per trial and: trials, survived,
bitwise-equal, orphans (and the worst time the ranks took to die), payloads executed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from helpers.damage import CRAFTS, DAMAGES, craft, damage  # noqa: E402  (the tests' own damage kinds)

STEPS, EVERY = 40, 5
STRATEGIES = ("ddp", "zero1", "fsdp")
SAVES = ("--checkpoint-async", "--no-checkpoint-async")
KINDS = ("kill-rank", "kill-launcher", "damage", "craft", "two-runs", "user-loader")


@dataclass(frozen=True)
class Config:
    strategy: str
    saves: str

    @property
    def name(self) -> str:
        return f"{self.strategy}/{'background' if self.saves == '--checkpoint-async' else 'sync'}"


def command(config: Config, exp: Path, logs: Path, restarts: int) -> list[str]:
    return [
        sys.executable,
        "-m",
        "trainscale",
        "run",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        str(restarts),
        "--log-dir",
        str(logs),
        "--workload",
        "gpt",
        "--n-layer",
        "1",
        "--n-embd",
        "32",
        "--n-head",
        "2",
        "--seq-len",
        "32",
        "--batch-size",
        "4",
        "--max-steps",
        str(STEPS),
        "--checkpoint-every",
        str(EVERY),
        "--log-every",
        "0",
        "--experiment-dir",
        str(exp),
        "--strategy",
        config.strategy,
        config.saves,
    ]


def environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSCALE_")}
    env["TRAINSCALE_RECORD"] = "0"
    return env


def checkpoints(exp: Path) -> list[Path]:
    directory = exp / "checkpoints"
    return (
        sorted(p for p in directory.glob("ckpt-*") if not p.name.endswith((".json", ".tmp")))
        if directory.is_dir()
        else []
    )


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
    after_last_save: bool = False
    """The fault came after the run's last checkpoint (nothing left to resume)."""
    ranks_gone_s: float | None = None
    """How long the ranks took to die after their launcher was killed."""


def timed(argv: list[str], cwd: Path | None = None) -> tuple[int, str, float]:
    """Run an undisturbed reference: (exit code, output, seconds from its ranks' start to its end)."""
    proc = subprocess.Popen(
        argv, cwd=cwd, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    launcher = psutil.Process(proc.pid)
    while proc.poll() is None and len(rank_processes(launcher)) < 2:
        time.sleep(0.02)
    started = time.monotonic()
    output, _ = proc.communicate(timeout=600)
    return proc.returncode, output, time.monotonic() - started


def rank_processes(launcher: psutil.Process) -> list[psutil.Process]:
    """A workload's forked ranks, or a script's bootstrap processes."""
    try:
        return [
            p
            for p in launcher.children(recursive=True)
            if p.name().startswith("ts-rank") or "trainscale.launch.bootstrap" in " ".join(p.cmdline())
        ]
    except psutil.Error:
        return []


def at_random_moment(
    proc: subprocess.Popen,
    launcher: psutil.Process,
    exp: Path,
    rng: random.Random,
    training_s: float,
    at_least_saves: int = 0,
) -> bool:
    """Wait for the ranks, then for a uniform random moment of the training (over the undisturbed run's time
    from its ranks' start to its end), and for ``at_least_saves`` checkpoints; False when the run ended first."""
    deadline = time.monotonic() + 300
    while proc.poll() is None and len(rank_processes(launcher)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    moment = time.monotonic() + rng.uniform(0.0, 0.95) * training_s
    while (
        proc.poll() is None
        and time.monotonic() < deadline
        and (time.monotonic() < moment or len(checkpoints(exp)) < at_least_saves)
    ):
        time.sleep(0.01)
    return proc.poll() is None


def at_random_step(proc: subprocess.Popen, log: Path, step: int) -> bool:
    """Wait until the user's script has logged ``step`` steps (its 160 steps take less than its ranks' start, so
    a moment drawn over the run's time would mostly land before its first step); False when it ended first."""
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            if log.read_text().count("\n") >= step:
                break
        time.sleep(0.005)
    return proc.poll() is None


def kill_launcher(launcher: psutil.Process, proc: subprocess.Popen, ranks: list[psutil.Process]) -> tuple[int, float]:
    """SIGKILL the launcher; (ranks left after 15 s, seconds until the last rank was gone)."""
    launcher.send_signal(signal.SIGKILL)
    proc.wait()
    began = time.monotonic()
    while alive(ranks) and time.monotonic() < began + 15:
        time.sleep(0.01)
    gone_s = time.monotonic() - began
    left = alive(ranks)
    for p in left:
        p.kill()
    return len(left), gone_s


def rerun(argv: list[str], exp: Path, detail: str) -> tuple[bool, str, str]:
    code, output = run(argv)
    survived = code == 0
    real = [p for p in checkpoints(exp) if not p.is_symlink()]  # a crafted link is not the run's
    last = real[-1] if real else None
    if (
        not survived
        and "resuming would train nothing" in output
        and last is not None
        and last.name.startswith(f"ckpt-{STEPS:08d}")
    ):
        # killed after its last save: the work was done, and the rerun says so and changes nothing (exit 1)
        survived, detail = True, detail + "; it had saved its last step: the rerun refused to train nothing"
    elif not survived:
        detail += tail(output)
    return survived, detail, output


def disturbed(
    kind: str, config: Config, work: Path, rng: random.Random, reference_s: float, reference: dict[str, torch.Tensor]
) -> Outcome:
    exp, logs = work / "exp", work / "logs"
    restarts = 3 if kind == "kill-rank" else 0
    argv = command(config, exp, logs, restarts)
    proc = subprocess.Popen(argv, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    launcher = psutil.Process(proc.pid)
    marker = work / "payload-ran"
    least = {"damage": 2, "craft": 2, "two-runs": 1}.get(kind, 0)
    if not at_random_moment(proc, launcher, exp, rng, reference_s, least):
        proc.communicate()
        return Outcome(
            proc.returncode == 0,
            proc.returncode == 0 and equal(final_state(exp), reference),
            detail="finished before the fault",
        )
    after_last = bool(checkpoints(exp)) and newest_step(exp) >= STEPS
    ranks = ranks_of(launcher)
    if kind == "kill-rank" and not ranks:  # the ranks have just ended: the run is finishing by itself
        proc.communicate()
        return Outcome(
            proc.returncode == 0,
            proc.returncode == 0 and equal(final_state(exp), reference),
            detail="finished before the fault",
        )
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
        return Outcome(
            survived,
            survived and equal(final_state(exp), reference),
            detail=detail if survived else detail + tail(output),
            after_last_save=after_last,
        )
    if kind == "two-runs":  # the first run held still (a long step) while the same command starts beside it
        for p in ranks:
            p.suspend()
        try:
            code, output = run(argv)
        finally:
            for p in ranks:
                p.resume()
        refused = code != 0 and "is in use by another run" in output
        # the first run past its last save has let its checkpoints go: the second finds nothing left to train
        done_before = after_last and code != 0 and "resuming would train nothing" in output
        output_first, _ = proc.communicate(timeout=600)
        survived = (refused or done_before) and proc.returncode == 0
        detail = (
            "the second run was refused naming the first"
            if refused
            else "the first had saved its last step: the second found nothing to train"
            if done_before
            else "the second run was NOT refused" + tail(output)
        ) + ("" if proc.returncode == 0 else "; the first failed" + tail(output_first))
        return Outcome(
            survived, survived and equal(final_state(exp), reference), detail=detail, after_last_save=after_last
        )
    orphans, gone_s = kill_launcher(launcher, proc, ranks)
    detail = (
        f"SIGKILL launcher after step {newest_step(exp)}'s checkpoint"
        if checkpoints(exp)
        else "SIGKILL launcher before the first checkpoint"
    ) + (f", {orphans} orphan(s)" if orphans else f", ranks gone in {gone_s:.2f}s")
    newest = checkpoints(exp)[-1] if checkpoints(exp) else None
    if kind == "damage":
        how = rng.choice(DAMAGES)
        changed = damage(newest, how, marker=marker)
        detail += f"; {how} {changed.relative_to(exp)}"
    if kind == "craft":
        how = rng.choice(CRAFTS if newest.is_dir() else ("renamed",))
        newest = craft(newest, how)
        detail += f"; {how} {newest.relative_to(exp)}"
    survived, detail, output = rerun(argv, exp, detail)
    if (
        kind in ("damage", "craft")
        and survived
        and "skipping checkpoint" not in output.lower()
        and newest.name not in output
    ):
        detail += "; no warning named the damaged checkpoint"
    return Outcome(
        survived, survived and equal(final_state(exp), reference), orphans, marker.exists(), detail, after_last, gone_s
    )


USER_SCRIPT = """
import sys
import torch
from torch import nn
import trainscale
from trainscale.data import DistributedLoader

class Ids(torch.utils.data.Dataset):
    def __len__(self):
        return 512
    def __getitem__(self, i):
        return torch.tensor([float(i % 7)]), i

with trainscale.init(seed=0) as rt:
    model, optimizer = rt.setup(nn.Linear(1, 1), lambda p: torch.optim.SGD(p, lr=1e-3), strategy="ddp")
    loader = DistributedLoader.for_runtime(Ids(), rt, batch_size=4)
    step = rt.resume(model, optimizer, loader=loader)
    seen = open(f"seen-rank{rt.rank}.txt", "a")
    while step < 160:  # 64 steps an epoch: 2.5 epochs
        epoch = loader.state_dict()["epoch"]
        for x, ids in loader:
            rt.backward(model(x).pow(2).mean())
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            seen.write(" ".join(f"{epoch}:{step}:{i}" for i in ids.tolist()) + "\\n")
            seen.flush()
            rt.checkpoint(step, model, optimizer, every=5, loader=loader)
            if step == 160:
                break
    rt.print("FINAL", [v.hex() for v in rt.unwrap(model).weight.detach().double().flatten().tolist()])
"""


def user_loader(work: Path, rng: random.Random, reference_s: float, reference: str) -> Outcome:
    """The user's script killed at a random moment and run again: every sample of each epoch trained on exactly
    once (the rerun trains the steps after its checkpoint again: the first run's lines for those are dropped),
    and its final weights an uninterrupted run's (``reference``)."""
    work.mkdir(parents=True)
    (work / "train.py").write_text(USER_SCRIPT)
    argv = [sys.executable, "-m", "trainscale", "run", "--nproc-per-node", "2", "--log-dir", "logs", "train.py"]
    proc = subprocess.Popen(
        argv, cwd=work, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    launcher = psutil.Process(proc.pid)
    if not at_random_step(proc, work / "seen-rank0.txt", rng.randint(1, 159)):
        output, _ = proc.communicate()
        return Outcome(proc.returncode == 0, "FINAL " + reference in output, detail="finished before the fault")
    orphans, gone_s = kill_launcher(launcher, proc, rank_processes(launcher))
    saved = sorted(int(p.name.split("-")[1].split(".")[0]) for p in (work / "checkpoints").glob("ckpt-*.pt"))
    resumed_at = saved[-1] if saved else 0
    done = subprocess.run(argv, cwd=work, env=environment(), capture_output=True, text=True, timeout=600)
    counts: dict[int, dict[int, int]] = {}
    for rank in (0, 1):
        lines = [
            [tuple(int(x) for x in item.split(":")) for item in line.split()]
            for line in (work / f"seen-rank{rank}.txt").read_text().splitlines()
        ]
        steps = [line[0][1] for line in lines]
        # the rerun starts where a step number goes back; none does when the first run logged nothing past the
        # checkpoint the rerun resumed from: then every line is one step once
        rerun_from = next((i for i in range(1, len(steps)) if steps[i] <= steps[i - 1]), 0)
        kept = [line for i, line in enumerate(lines) if i >= rerun_from or steps[i] <= resumed_at]
        for epoch, _, sample in (item for line in kept for item in line):
            counts.setdefault(epoch, {})
            counts[epoch][sample] = counts[epoch].get(sample, 0) + 1
    whole = {0: 512, 1: 512, 2: 256}  # 160 steps of 2 ranks x 4: two epochs and half a third
    exact = {e: len(c) for e, c in counts.items()} == whole and all(set(c.values()) == {1} for c in counts.values())
    survived = done.returncode == 0
    detail = (
        f"SIGKILL launcher after step {resumed_at}'s checkpoint"
        + (f", {orphans} orphan(s)" if orphans else f", ranks gone in {gone_s:.2f}s")
        + ("; every sample once per epoch" if exact else f"; samples NOT once per epoch: {counts}"[:300])
    )
    return Outcome(
        survived and exact,
        survived and "FINAL " + reference in done.stdout + done.stderr,
        orphans,
        False,
        detail if survived else detail + tail(done.stdout + done.stderr),
        resumed_at >= 160,
        gone_s,
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=36)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", action="store_true", help="keep the trials' directories")
    p.add_argument(
        "--kinds", default=",".join(KINDS), help=f"comma-separated, in turn (default: all: {','.join(KINDS)})"
    )
    ns = p.parse_args()
    rng = random.Random(ns.seed)
    kinds = [k for k in ns.kinds.split(",") if k]
    if not kinds or set(kinds) - set(KINDS):
        p.error(f"--kinds: choose from {', '.join(KINDS)}")
    root = Path(tempfile.mkdtemp(prefix="trainscale-chaos-"))
    references: dict[Any, tuple[float, Any]] = {}
    rows = []
    for trial in range(1, ns.trials + 1):
        config = Config(rng.choice(STRATEGIES), rng.choice(SAVES))
        kind = kinds[(trial - 1) % len(kinds)]  # each kind as often, configurations at random
        work = root / f"trial-{trial:03d}"
        if kind == "user-loader":
            if "user" not in references:
                ref = root / "reference-user"
                ref.mkdir()
                (ref / "train.py").write_text(USER_SCRIPT)
                code, output, training_s = timed(
                    [
                        sys.executable,
                        "-m",
                        "trainscale",
                        "run",
                        "--nproc-per-node",
                        "2",
                        "--log-dir",
                        "logs",
                        "train.py",
                    ],
                    cwd=ref,
                )
                final = re.search(r"FINAL (.*)", output)
                if code != 0 or final is None:
                    print(output)
                    raise SystemExit("the uninterrupted user-script run failed")
                references["user"] = (training_s, final.group(1))
            started = time.monotonic()
            outcome = user_loader(work, rng, *references["user"])
            label = "user script"
        else:
            if config not in references:
                ref = root / f"reference-{config.strategy}-{config.saves.strip('-')}"
                code, output, training_s = timed(command(config, ref / "exp", ref / "logs", 0))
                if code != 0:
                    print(output)
                    raise SystemExit(f"the uninterrupted {config.name} run failed")
                references[config] = (training_s, final_state(ref / "exp"))
            started = time.monotonic()
            outcome = disturbed(kind, config, work, rng, *references[config])
            label = config.name
        rows.append((trial, kind, label, outcome, time.monotonic() - started))
        print(
            f"{trial:>3}  {kind:<13} {label:<16} survived={outcome.survived!s:<5} "
            f"bitwise={outcome.equal!s:<5} {time.monotonic() - started:5.1f}s  {outcome.detail}",
            flush=True,
        )
        if not ns.keep and outcome.survived and outcome.equal:  # a failed trial's directory stays, to read
            shutil.rmtree(work, ignore_errors=True)
    n = len(rows)
    injected = sum(r[3].detail != "finished before the fault" for r in rows)
    after_last = sum(r[3].after_last_save for r in rows)
    survived = sum(r[3].survived for r in rows)
    equal_ = sum(r[3].equal for r in rows)
    orphans = sum(r[3].orphans for r in rows)
    payloads = sum(r[3].payload_ran for r in rows)
    gone = [r[3].ranks_gone_s for r in rows if r[3].ranks_gone_s is not None]
    kinds = {k: sum(r[1] == k for r in rows) for k in KINDS}
    print(
        f"\ntrials {n} ({injected} with a fault injected, {after_last} of them after the run's last save; the "
        f"others ended before it; {', '.join(f'{k} {v}' for k, v in kinds.items())}), survived {survived} "
        f"({survived / n:.0%}), bitwise-equal {equal_} ({equal_ / n:.0%}), orphaned ranks {orphans}"
        + (
            f" (ranks gone after their launcher's SIGKILL: median {statistics.median(gone):.2f}s, worst "
            f"{max(gone):.2f}s)"
            if gone
            else ""
        )
        + f", payloads executed {payloads}"
    )
    failed = [r for r in rows if not (r[3].survived and r[3].equal)]
    if failed:
        print(f"failed trials' directories: {root}")
    elif not ns.keep:
        shutil.rmtree(root, ignore_errors=True)
    return 0 if survived == equal_ == n and not orphans and not payloads else 1


if __name__ == "__main__":
    raise SystemExit(main())
