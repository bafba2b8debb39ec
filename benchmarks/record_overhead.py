"""What observing a script costs: trainscale's zero-code recorder (global optimizer and module hooks, the step
clock, the records its thread writes) and the rank's heartbeat, against the same training without them.

    .venv/bin/python benchmarks/record_overhead.py [--blocks 8] [--tiny-only] [--rounds 2] [--e2e-steps 300]

1. **In one process, A/B by interleaved blocks** (the robust figure: on a shared host the noise between
   processes is larger than the goal). Tiny steps, where the cost is absolute (goal <= 30 us per step): PyTorch's
   DDP tutorial loop (ToyModel: Linear(10,10), ReLU, Linear(10,5); SGD; batch 20) and a nanoGPT-style loop
   (the next batch fetched between forward and backward, 2 micro-batches of gradient accumulation, AdamW).
   Steps of 10 ms or more, where it is relative (goal <= 1%): the seed CNN at batch 16 and a 6-layer
   transformer LM. Each block is timed three ways: by the training thread's CPU time (the step's critical
   path: the tiny loops' verdict), by the process's CPU time (all its threads, the records' thread's JSON and
   writing included, made to run within the block: what the observation costs a saturated host) and by the
   clock. Each figure is the median over the block pairs of (observed - not), per step. Plus the recorder's hooks' own
   work on a do-nothing model with the same module calls, and the heartbeat's work per beat. And for the tiny
   loops, the Python bytecodes the observation adds per step, by function (``sys.settrace``'s opcode events):
   a count, the same on a quiet or a loaded machine, to follow the hot path where the clock cannot (this
   machine's timings of the tiny loops have moved by tens of us between runs).
2. **End to end, interleaved rounds**: ``trainscale run --nproc-per-node 2`` (observation on, the default), the
   same with ``TRAINSCALE_RECORD=0 TRAINSCALE_HANG_NOTICE=0``, and plain torchrun
   (``python -m torch.distributed.run --standalone --nproc-per-node 2``), of the conformance suite's plain DDP
   script (tests/conformance/scripts/ddp_plain.py) and of the DDP tutorial's script; each run's own median
   step time (the interval between its optimizer steps, taken by a global step hook in all three), ratio =
   median over rounds against torchrun's. Noisy on a shared host: printed with the load.
"""

from __future__ import annotations

import argparse
import collections
import statistics
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from _common import PYTHON, ROOT, clean_env, load, median, read_json, run, verdict


def models():
    import torch
    from torch import nn

    from trainscale.workloads.cnn import CNN

    class Block(nn.Module):
        def __init__(self, d: int) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.attn = nn.MultiheadAttention(d, 4, batch_first=True)
            self.up, self.act, self.down = nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d)
            self.drop = nn.Dropout(0.0)

        def forward(self, x):
            h = self.ln1(x)
            x = x + self.drop(self.attn(h, h, h, need_weights=False)[0])
            return x + self.drop(self.down(self.act(self.up(self.ln2(x)))))

    class LM(nn.Module):
        def __init__(self, vocab: int = 512, d: int = 128, layers: int = 6) -> None:
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.blocks = nn.ModuleList(Block(d) for _ in range(layers))
            self.head = nn.Linear(d, vocab)

        def forward(self, idx):
            x = self.emb(idx)
            for block in self.blocks:
                x = block(x)
            return self.head(x)

    torch.manual_seed(0)
    cnn_x, cnn_y = torch.randn(16, 1, 28, 28), torch.randint(0, 10, (16,))
    lm_x = torch.randint(0, 512, (8, 64))
    return {
        "seed CNN, batch 16": (CNN(), lambda m: nn.functional.nll_loss(m(cnn_x), cnn_y)),
        "transformer LM (6 layers, d 128, 8x64 tokens)": (
            LM(),
            lambda m: nn.functional.cross_entropy(m(lm_x).flatten(0, 1), lm_x.flatten()),
        ),
    }


def tiny_loops():
    """The tiny-step loops: PyTorch's DDP tutorial (without the process group) and nanoGPT's shape."""
    import torch
    from torch import nn

    class ToyModel(nn.Module):  # PyTorch's DDP tutorial
        def __init__(self) -> None:
            super().__init__()
            self.net1, self.relu, self.net2 = nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)

        def forward(self, x):
            return self.net2(self.relu(self.net1(x)))

    torch.manual_seed(0)
    toy, toy_x, toy_y = ToyModel(), torch.randn(20, 10), torch.randn(20, 5)
    toy_opt, mse = torch.optim.SGD(toy.parameters(), lr=0.001), nn.MSELoss()

    def tutorial() -> None:
        toy_opt.zero_grad()
        mse(toy(toy_x), toy_y).backward()
        toy_opt.step()

    data = torch.randint(0, 64, (10_000,))
    gpt = nn.Sequential(nn.Embedding(64, 32), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, 64))
    gpt_opt = torch.optim.AdamW(gpt.parameters(), lr=1e-3)

    def get_batch():
        ix = torch.randint(len(data) - 9, (4,))
        return torch.stack([data[i : i + 8] for i in ix]), torch.stack([data[i + 1 : i + 9] for i in ix])

    batch = [get_batch()]

    def nanogpt() -> None:
        for _ in range(2):  # gradient accumulation, nanoGPT's order: forward, fetch the next batch, backward
            x, y = batch[0]
            loss = nn.functional.cross_entropy(gpt(x).flatten(0, 1), y.flatten()) / 2
            batch[0] = get_batch()
            loss.backward()
        gpt_opt.step()
        gpt_opt.zero_grad(set_to_none=True)

    return {
        "DDP tutorial's ToyModel, batch 20, SGD": tutorial,
        "nanoGPT-style (fetch between forward and backward, 2 micro-batches), AdamW": nanogpt,
    }


def larger_loops():
    """Steps of 10 ms or more: the seed CNN and a small transformer LM, plain loops with AdamW."""
    import torch

    loops = {}
    for name, (model, loss_of) in models().items():
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step(opt=opt, model=model, loss_of=loss_of) -> None:
            opt.zero_grad()
            loss_of(model).backward()
            opt.step()

        loops[name] = step
    return loops


def ab(step, blocks: int, steps: int, run_dir: Path) -> dict[str, list[float]]:
    """Seconds per step, by CPU time and by the clock, of interleaved blocks observed and not."""
    from trainscale.observe import hooks
    from trainscale.observe.sampler import INTERVAL_VAR as SAMPLING

    def block(recorder=None) -> tuple[float, float, float]:
        cpu, wall, own = time.process_time(), time.perf_counter(), time.thread_time()
        for _ in range(steps):
            step()
        own = time.thread_time() - own
        if recorder is not None:  # the block's records made and written: the flushing thread's work counts too
            recorder.flush()
        return (time.process_time() - cpu) / steps, (time.perf_counter() - wall) / steps, own / steps

    block(), block()  # warm-up: allocator, caches
    out: dict[str, list[float]] = {f"{mode}_{clock}": [] for mode in ("on", "off") for clock in ("cpu", "wall", "own")}
    for k in range(blocks):
        for mode in ("on", "off") if k % 2 == 0 else ("off", "on"):
            recorder = None
            if mode == "on":  # the device sampler (every 5 s) apart: its start would land in a block
                recorder = hooks.Recorder(run_dir / f"{k}-{mode}", environ={SAMPLING: "0"}).install()
            if recorder is not None:
                recorder.flops_per_step = 0  # counted once per run, not per block: timed on its own below
                # its record file opened, its thread started, its top-level modules found: once per run
                for _ in range(hooks.SETTLE_STEPS + 2):
                    step()
                recorder.flush()
            cpu, wall, own = block(recorder)
            if recorder is not None:
                recorder.finish()
            out[f"{mode}_cpu"].append(cpu)
            out[f"{mode}_wall"].append(wall)
            out[f"{mode}_own"].append(own)
    return out


def bytecodes(step, steps: int, run_dir: Path) -> tuple[float, float, list[tuple[float, str]]]:
    """Python bytecodes per step of ``step`` not observed and observed, and the functions that add most."""
    from trainscale.observe import hooks
    from trainscale.observe.sampler import INTERVAL_VAR as SAMPLING

    counts: collections.Counter = collections.Counter()

    def opcode(frame, event, arg):
        if event == "opcode":
            counts[frame.f_code] += 1
        return opcode

    def each_frame(frame, event, arg):
        frame.f_trace_opcodes, frame.f_trace_lines = True, False
        return opcode

    def count() -> collections.Counter:
        counts.clear()
        sys.settrace(each_frame)
        try:
            for _ in range(steps):
                step()
        finally:
            sys.settrace(None)
        return collections.Counter(counts)

    off = count()
    recorder = hooks.Recorder(run_dir / "bytecodes", environ={SAMPLING: "0"}).install()
    try:
        recorder.flops_per_step = 0
        for _ in range(hooks.SETTLE_STEPS + 2):
            step()
        on = count()
    finally:
        recorder.finish()
    added = {code: (on[code] - off[code]) / steps for code in on}
    top = sorted(
        ((n, f"{Path(code.co_filename).name}:{code.co_name}") for code, n in added.items() if n >= 1), reverse=True
    )
    return sum(off.values()) / steps, sum(on.values()) / steps, top[:6]


def judged(times: dict[str, list[float]], clock: str, goal_us: float) -> str:
    """The verdict on a tiny loop's cost, or that this machine's noise is too large to give one: the block pairs'
    differences spread (between their quartiles) wider than the goal itself."""
    diffs = sorted((a - b) * 1e6 for a, b in zip(times[f"on_{clock}"], times[f"off_{clock}"]))
    quartiles = statistics.quantiles(diffs, n=4) if len(diffs) >= 2 else [0.0, 0.0, 0.0]
    if quartiles[2] - quartiles[0] > goal_us:
        return f"too noisy here to judge (the block pairs spread {quartiles[0]:+.0f} to {quartiles[2]:+.0f} us)"
    return verdict(paired(times, clock) * 1e6, goal_us, higher_is_better=False)


def paired(times: dict[str, list[float]], clock: str) -> float:
    """Median over the block pairs of observed - not, seconds per step."""
    return statistics.median(a - b for a, b in zip(times[f"on_{clock}"], times[f"off_{clock}"]))


def in_process(blocks: int, tiny_steps: int, steps: int, tiny_only: bool = False) -> None:
    import torch

    torch.set_num_threads(1)
    run_dir = Path(tempfile.mkdtemp(prefix="ts-overhead-"))
    print(f"in one process, {blocks} interleaved blocks each way ({load()}):", flush=True)
    for name, step in tiny_loops().items():
        t = ab(step, blocks, tiny_steps, run_dir / "tiny")
        cost = paired(t, "own")
        print(
            f"  {name}: {statistics.median(t['off_cpu']) * 1e6:.0f} us/step; observation "
            f"{cost * 1e6:+.1f} us/step on the training thread (its CPU time: the step's critical path), "
            f"{paired(t, 'cpu') * 1e6:+.1f} with the records' thread (the process's CPU time), "
            f"{paired(t, 'wall') * 1e6:+.1f} by the clock with the records written in the block; "
            f"on the training thread {judged(t, 'own', 30)}, with the records' thread {judged(t, 'cpu', 30)} "
            f"[blocks of {tiny_steps} steps]",
            flush=True,
        )
        off, on, top = bytecodes(step, 100, run_dir / "tiny")
        print(
            f"    Python bytecodes per step: {off:.0f} not observed, {on:.0f} observed (+{on - off:.0f}); most in "
            + ", ".join(f"{where} {n:.0f}" for n, where in top),
            flush=True,
        )
    if tiny_only:
        return
    for name, step in larger_loops().items():
        t = ab(step, blocks, steps, run_dir / "larger")
        off = statistics.median(t["off_cpu"])
        cost, wall = paired(t, "cpu") / off, paired(t, "wall") / statistics.median(t["off_wall"])
        print(
            f"  {name}: {off * 1e3:.1f} ms/step; observation {cost:+.2%} by CPU time ({wall:+.2%} by the clock), "
            f"{verdict(1 + cost, 1.01, higher_is_better=False)} [blocks of {steps} steps]",
            flush=True,
        )
    for name, (model, loss_of) in models().items():
        from trainscale.observe.flops import plain_step_flops

        began = time.perf_counter()
        counted = plain_step_flops(model, loss_of)
        flops_s = time.perf_counter() - began
        calls = model_calls(model, loss_of)
        print(
            f"  {name}: the hooks' own work for its {calls} module calls: {hooks_cost(calls) * 1e6:.0f} us per "
            f"step (CPU time, best of 5); once per run, counting a step's FLOPs ({counted / 1e9:.2f} GFLOP) took "
            f"{flops_s * 1e3:.0f} ms, left out of every step record",
            flush=True,
        )
    beat_s = heartbeat_cost(run_dir)
    print(f"  heartbeat: {beat_s * 1e6:.0f} us of work per beat every 0.5 s = {beat_s / 0.5:.3%} of one core")
    sample_s = sampler_cost(run_dir)
    print(f"  device sampler: {sample_s * 1e3:.1f} ms of CPU per sample every 5 s = {sample_s / 5:.3%} of one core")


def sampler_cost(run_dir: Path, samples: int = 20) -> float:
    """CPU seconds one device sample takes (local rank 0's thread, every ``TRAINSCALE_SAMPLE_INTERVAL`` s)."""
    from trainscale.observe.sampler import Sampler

    sampler = Sampler(run_dir / "sampler", interval_s=3600, local_ranks=1)
    sampler.sample()  # the first reads what later ones keep
    began = time.process_time()
    for _ in range(samples):
        sampler.sample()
    return (time.process_time() - began) / samples


def model_calls(model, loss_of) -> int:
    """Module calls in one forward (every one passes the global module hooks)."""
    import torch

    calls = []
    handle = torch.nn.modules.module.register_module_forward_pre_hook(lambda m, a: calls.append(m))
    try:
        with torch.no_grad():
            loss_of(model)
    finally:
        handle.remove()
    return len(calls)


def hooks_cost(module_calls: int, steps: int = 3000) -> float:
    """Seconds the recorder adds to one step with ``module_calls`` module calls per forward: a step of a model
    that does nearly nothing (nn.Identity layers, one Linear), with and without the recorder, best of 5 each."""
    import torch
    from torch import nn

    from trainscale.observe import hooks

    model = nn.Sequential(nn.Linear(4, 4), *(nn.Identity() for _ in range(max(0, module_calls - 2))))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(2, 4)

    def run() -> float:
        began = time.process_time()
        for _ in range(steps):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        return (time.process_time() - began) / steps

    run()
    off, on = [], []
    for _ in range(5):
        off.append(run())
        recorder = hooks.Recorder(tempfile.mkdtemp(prefix="ts-hooks-"), environ={}).install()
        recorder.flops_per_step = 0
        on.append(run())
        recorder.finish()
    return max(0.0, min(on) - min(off))


def heartbeat_cost(run_dir: Path, beats: int = 400) -> float:
    """Seconds one beat's own work takes (its record, the store write, the watchdog re-armed)."""
    import datetime
    from types import SimpleNamespace

    from torch.distributed import TCPStore

    from trainscale.runtime.hangwatch.heartbeat import Heartbeat

    store = TCPStore("127.0.0.1", 0, world_size=1, is_master=True, timeout=datetime.timedelta(seconds=10))
    runtime = SimpleNamespace(is_distributed=False, rank=0, world_size=2, timeout=datetime.timedelta(minutes=30))
    beat = Heartbeat(runtime, run_dir=str(run_dir / "beat"))
    beat.store = store
    costs = []
    for k in range(beats):
        beat.step = k  # progress every beat: a record written each time, as during training
        began = time.perf_counter()
        beat._rearm_watchdog()
        beat._publish(time.monotonic())
        costs.append(time.perf_counter() - began)
    beat.close()
    return statistics.median(costs)


TUTORIAL = textwrap.dedent("""
    # PyTorch's DDP tutorial (ddp_tutorial.rst, "Basic Use Case"), launched by torchrun: ToyModel, SGD, batch 20
    import os
    import torch, torch.distributed as dist, torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    class ToyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.net1, self.relu, self.net2 = nn.Linear(10, 10), nn.ReLU(), nn.Linear(10, 5)

        def forward(self, x):
            return self.net2(self.relu(self.net1(x)))

    dist.init_process_group("gloo")
    model = DDP(ToyModel())
    loss_fn, optimizer = nn.MSELoss(), torch.optim.SGD(model.parameters(), lr=0.001)
    for _ in range(int(os.environ["STEPS"])):
        optimizer.zero_grad()
        loss_fn(model(torch.randn(20, 10)), torch.randn(20, 5)).backward()
        optimizer.step()
    dist.destroy_process_group()
""")

TIMED = textwrap.dedent("""
    # runs the script; rank 0 writes the median interval between its optimizer steps (a global step hook, the
    # same under every launcher) to $STEP_TIMES
    import json, os, runpy, statistics, sys, time
    from torch.optim.optimizer import register_optimizer_step_post_hook

    script = sys.argv[1]
    ends = []
    register_optimizer_step_post_hook(lambda *_: ends.append(time.perf_counter()))
    sys.argv, sys.path[0] = sys.argv[1:], os.path.dirname(os.path.abspath(script))
    runpy.run_path(script, run_name="__main__")
    if os.environ.get("RANK") == "0":
        gaps = [b - a for a, b in zip(ends[len(ends) // 4 :], ends[len(ends) // 4 + 1 :])]  # past the warm-up
        json.dump({"step_s": statistics.median(gaps), "steps": len(ends)}, open(os.environ["STEP_TIMES"], "w"))
""")

LAUNCHERS = {
    "trainscale": ([PYTHON, "-m", "trainscale", "run", "--nproc-per-node", "2"], {}),
    "trainscale, observation off": (
        [PYTHON, "-m", "trainscale", "run", "--nproc-per-node", "2"],
        {"TRAINSCALE_RECORD": "0", "TRAINSCALE_HANG_NOTICE": "0"},
    ),
    "torchrun": ([PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"], {}),
}


def end_to_end(rounds: int, steps: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ts-overhead-e2e-"))
    (tmp / "tutorial_ddp.py").write_text(TUTORIAL)
    (tmp / "timed.py").write_text(TIMED)
    scripts = {
        "plain DDP (tests/conformance/scripts/ddp_plain.py)": ROOT / "tests/conformance/scripts/ddp_plain.py",
        "DDP tutorial (ToyModel)": tmp / "tutorial_ddp.py",
    }
    print(f"end to end, 2 ranks, {rounds} interleaved rounds, {steps} steps per run:", flush=True)
    for name, script in scripts.items():
        times: dict[str, list[float]] = {launcher: [] for launcher in LAUNCHERS}
        for k in range(rounds):
            order = list(LAUNCHERS) if k % 2 == 0 else list(reversed(LAUNCHERS))
            for launcher in order:
                argv, switches = LAUNCHERS[launcher]
                out = tmp / f"{script.stem}-{k}-{launcher}.json"
                env = clean_env(STEPS=str(steps), OUT=str(tmp / "out"), STEP_TIMES=str(out), **switches)
                run([*argv, "--log-dir", str(tmp / "runs"), str(tmp / "timed.py"), str(script)], env=env, cwd=tmp)
                times[launcher].append(read_json(out)["step_s"])
        base = median(times["torchrun"])
        each = [f"{launcher} {median(v) * 1e3:.2f} ms/step ({median(v) / base:.2f}x)" for launcher, v in times.items()]
        print(f"  {name}: {'; '.join(each)} ({load()})", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, default=8, help="in-process blocks each way (0: skip)")
    p.add_argument("--tiny-steps", type=int, default=300, help="steps per block of the tiny loops")
    p.add_argument("--steps", type=int, default=12, help="steps per block of the larger loops")
    p.add_argument("--tiny-only", action="store_true", help="in process, the tiny loops only")
    p.add_argument("--rounds", type=int, default=2, help="end-to-end rounds (0: skip)")
    p.add_argument("--e2e-steps", type=int, default=300, help="steps per end-to-end run")
    a = p.parse_args()
    if a.blocks:
        in_process(a.blocks, a.tiny_steps, a.steps, a.tiny_only)
    if a.rounds:
        end_to_end(a.rounds, a.e2e_steps)


if __name__ == "__main__":
    main()
