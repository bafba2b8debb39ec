"""What observing a script costs: trainscale's zero-code recorder (global optimizer and module hooks, the step
clock, the buffered record lines) and the rank's heartbeat, against the same training without them.

    .venv/bin/python benchmarks/record_overhead.py [--blocks 20] [--steps 40] [--e2e 4]

1. **In one process, A/B by blocks** (the figure that counts; a shared 2-core host's noise between processes
   is larger than the goal): a plain PyTorch loop of the seed CNN at batch 16 (seed 004's model) and of a
   larger model (a 6-layer transformer language model, 55 module calls per forward), alternating blocks of
   ``--steps`` steps with the recorder installed and not, ``--blocks`` times each; ratio = median step time
   observed / not observed (goal <= 1.01). Plus the heartbeat's own work per beat (its record, the main
   thread's place, the store write, the C watchdog re-armed) over its 0.5 s period.
2. **End to end**: `trainscale run --nproc-per-node 2` of a plain DDP script with the seed CNN at batch 16,
   observation on (the default) and off (TRAINSCALE_RECORD=0 TRAINSCALE_HANG_NOTICE=0), interleaved ``--e2e``
   times; the script times its own steps. Noisier: printed for completeness.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import textwrap
import time
from pathlib import Path

from _common import PYTHON, clean_env, load, median, read_json, run, verdict


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


def in_process(blocks: int, steps: int) -> None:
    import torch

    from trainscale.observe import hooks

    torch.set_num_threads(1)
    run_dir = Path(tempfile.mkdtemp(prefix="ts-overhead-"))
    for name, (model, loss_of) in models().items():
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def block(opt=opt, model=model, loss_of=loss_of) -> float:
            began = time.perf_counter()
            for _ in range(steps):
                opt.zero_grad()
                loss_of(model).backward()
                opt.step()
            return (time.perf_counter() - began) / steps

        block(), block()  # warm-up: allocator, caches
        times: dict[str, list[float]] = {"on": [], "off": []}
        for k in range(blocks):
            for mode in ("on", "off") if k % 2 == 0 else ("off", "on"):
                recorder = (
                    hooks.Recorder(run_dir / name.split()[0] / mode, environ={}).install() if mode == "on" else None
                )
                if recorder is not None:
                    recorder.flops_per_step = 0  # counted once per run, not per block: timed on its own below
                times[mode].append(block())
                if recorder is not None:
                    recorder.finish()
        from trainscale.observe.flops import plain_step_flops

        began = time.perf_counter()
        counted = plain_step_flops(model, loss_of)
        flops_s = time.perf_counter() - began
        on, off = statistics.median(times["on"]), statistics.median(times["off"])
        best = min(times["on"]) / min(times["off"])
        print(
            f"{name}: {on * 1e3:.3f} ms/step observed vs {off * 1e3:.3f} ms/step not "
            f"(median of {blocks} blocks of {steps} steps each, interleaved): ratio {on / off:.4f} "
            f"(fastest blocks: {best:.4f}); once per run: counting a step's FLOPs ({counted / 1e9:.2f} GFLOP) took "
            f"{flops_s * 1e3:.0f} ms, left out of every step record",
            flush=True,
        )
        direct = hooks_cost(model_calls(model, loss_of))
        print(
            f"  the hooks' own work: {direct * 1e6:.0f} us per step = {direct / off:.2%} of this step: "
            f"{verdict(1 + direct / off, 1.01, higher_is_better=False)}",
            flush=True,
        )
    beat_s = heartbeat_cost(run_dir)
    print(f"heartbeat: {beat_s * 1e6:.0f} us of work per beat every 0.5 s = {beat_s / 0.5:.3%} of one core")


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
        began = time.perf_counter()
        for _ in range(steps):
            opt.zero_grad()
            model(x).sum().backward()
            opt.step()
        return (time.perf_counter() - began) / steps

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


SCRIPT = textwrap.dedent("""
    import json, os, sys, time
    import torch, torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    from trainscale.data.images import load_images
    from trainscale.workloads.cnn import CNN

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    s = load_images("digits", "train")
    data = TensorDataset(s.images, s.labels)
    loader = DataLoader(data, batch_size=16, sampler=DistributedSampler(data, seed=0))
    model = DDP(CNN())
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    times = []
    for epoch in range(int(sys.argv[2])):
        loader.sampler.set_epoch(epoch)
        began = time.perf_counter()
        for x, y in loader:
            opt.zero_grad()
            F.nll_loss(model(x), y).backward()
            opt.step()
        times.append((time.perf_counter() - began) / len(loader))
    if dist.get_rank() == 0:
        json.dump({"step_s": min(times[1:] or times)}, open(sys.argv[1], "w"))
    dist.destroy_process_group()
""")


def end_to_end(repeats: int, epochs: int) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="ts-overhead-e2e-"))
    script = tmp / "seed_ddp.py"
    script.write_text(SCRIPT)
    times: dict[str, list[float]] = {"on": [], "off": []}
    for k in range(repeats):
        for mode in ("on", "off") if k % 2 == 0 else ("off", "on"):
            switches = {} if mode == "on" else {"TRAINSCALE_RECORD": "0", "TRAINSCALE_HANG_NOTICE": "0"}
            out = tmp / f"{mode}-{k}.json"
            run(
                [
                    PYTHON,
                    "-m",
                    "trainscale",
                    "run",
                    "--nproc-per-node",
                    "2",
                    "--log-dir",
                    str(tmp / "runs"),
                    str(script),
                    str(out),
                    str(epochs),
                ],
                env=clean_env(**switches),
                cwd=tmp,
            )
            times[mode].append(read_json(out)["step_s"])
    on, off = median(times["on"]), median(times["off"])
    print(
        f"end to end, 2 ranks, seed CNN batch 16 (best epoch of {epochs}, median of {repeats}): "
        f"{on * 1e3:.2f} ms/step observed vs {off * 1e3:.2f} not: ratio {on / off:.3f} ({load()})"
    )


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--e2e", type=int, default=4, help="end-to-end repeats (0: skip)")
    p.add_argument("--epochs", type=int, default=2)
    a = p.parse_args()
    in_process(a.blocks, a.steps)
    if a.e2e:
        end_to_end(a.e2e, a.epochs)


if __name__ == "__main__":
    main()
