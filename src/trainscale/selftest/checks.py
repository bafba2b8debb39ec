"""The checks of ``trainscale selftest``, as each rank runs them (``selftest/rank.py`` runs them
in order and gathers the results on rank 0; ``selftest/run.py`` launches the ranks and reports).

Each check takes the Runtime and returns a :class:`Check`: pass, fail, warn or skip, the figures a
support ticket needs, and details. Every check is a collective: all ranks call it, in the same order.
The same behaviours are tested in ``tests/gpu/`` (GPUs) and ``tests/integration`` (gloo). The
tolerances, and what makes each row FAIL or WARN: docs/gpu.md.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainscale.bench.allreduce import format_size, measure, nearest_row, plateau, plateau_words, sizes_for
from trainscale.checkpoint import Checkpointer, RNGState
from trainscale.observe.devices import identity
from trainscale.observe.hooks import Recorder
from trainscale.observe.interconnect import intra_node_transports
from trainscale.observe.reading import rank_stats
from trainscale.observe.records import metrics_dir, read_lines
from trainscale.runtime.device import VISIBLE_VARS
from trainscale.runtime.seed import rng_state, set_rng_state
from trainscale.strategies import get_strategy
from trainscale.strategies.base import OptimizerSpec
from trainscale.topology import detect
from trainscale.topology.nvidia import expected_busbw_gbps, parse_nvidia_links
from trainscale.topology.plan import node_gpu_indices

STEPS, MIN_GLOBAL_BATCH, WIDTH = 4, 32, 64
BREAKDOWN_WIDTH, BREAKDOWN_LAYERS = 1024, 6
"""The breakdown check's model: 6 x (1024 x 1024 + 1024) fp32 parameters, 25.2 MB of gradients (more than
one DDP bucket), so that its all-reduce takes measurable time on any link."""
ALLREDUCE_SHARE = 0.5
"""An all-reduce over GPUs joined by NVLink must reach this share of their links' bandwidth (WARN below)."""
BREAKDOWN_SHARE = 0.5
"""The breakdown must see at least this share of the communication the measured bus bandwidth implies."""
NEEDS_RANKS = ("all-reduce", "equivalence", "strategies", "breakdown")
"""The checks that compare ranks: skipped on one."""
SGD = OptimizerSpec(torch.optim.SGD, {"lr": 0.05})


@dataclass(frozen=True, kw_only=True)
class Check:
    """One row of the selftest table."""

    name: str
    """Short name (devices, all-reduce, equivalence, ...)."""
    status: str
    """pass, fail, warn or skip."""
    figure: str
    """What was measured, in one line with the numbers."""
    detail: dict[str, Any] = field(default_factory=dict)
    """Machine-readable values behind the figure."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def tolerance(rt) -> float:
    return 1e-5 if rt.device.type == "cuda" else 1e-6


@contextlib.contextmanager
def exact_fp32() -> Iterator[None]:
    """TF32 off for the comparisons: it would round every matmul to 10 bits on Ampere and later."""
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def mlp(dropout: float = 0.0) -> nn.Module:
    torch.manual_seed(7)
    layers: list[nn.Module] = []
    for _ in range(3):
        layers += [nn.Linear(WIDTH, WIDTH), nn.Tanh()] + ([nn.Dropout(dropout)] if dropout else [])
    return nn.Sequential(*layers, nn.Linear(WIDTH, 8))


def global_batch(world_size: int) -> int:
    """MIN_GLOBAL_BATCH rounded up to a multiple of the world size, so that every rank gets the same share
    of it: 32 on 1, 2, 4 ... 32 ranks as before; 48 on 24 ranks, where 32 // 24 left 8 samples out of DDP
    but not out of the one-process reference (equivalence failed), and 64 on 64, where every share was empty."""
    return -(-MIN_GLOBAL_BATCH // world_size) * world_size


def batch(step: int, rt, whole: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Step ``step``'s global batch (seeded by the step), or this rank's even share of it."""
    size = global_batch(rt.world_size)
    g = torch.Generator().manual_seed(1000 + step)
    x, y = torch.randn(size, WIDTH, generator=g), torch.randint(0, 8, (size,), generator=g)
    if not whole:
        per = size // rt.world_size
        x, y = x[rt.rank * per : (rt.rank + 1) * per], y[rt.rank * per : (rt.rank + 1) * per]
    return x.to(rt.device), y.to(rt.device)


def params(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu().clone() for k, v in getattr(model, "module", model).state_dict().items()}


def max_rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[k] - b[k]).abs().max() / b[k].abs().max().clamp_min(1e-12)) for k in b)


def gather(rt, value: Any) -> list[Any]:
    """Every rank's ``value`` on every rank (a list in rank order)."""
    if not rt.is_distributed:
        return [value]
    out: list[Any] = [None] * rt.world_size
    dist.all_gather_object(out, value)
    return out


def _gpu_id(device: torch.device) -> str:
    """The GPU's PCI address where torch knows it (unique per device: two GCDs of an MI250X may share a
    UUID, or have none), else its UUID, else its name and index."""
    ident = identity(device) or {}
    return ident.get("pci") or ident.get("uuid") or f"{torch.cuda.get_device_properties(device).name} {device}"


def check_devices(rt) -> Check:
    """Each rank's device; on GPUs every rank of a host drives its own GPU, the one trainscale promises."""
    visible = {k: os.environ[k] for k in VISIBLE_VARS if k in os.environ}
    cuda = rt.device.type == "cuda"
    mine = {
        "rank": rt.rank,
        "host": socket.gethostname(),
        "node": rt.node_rank,
        "local_rank": rt.local_rank,
        "device": str(rt.device),
        "visible": visible,
        "gpu": _gpu_id(rt.device) if cuda else None,
        "count": torch.cuda.device_count() if cuda else 0,
        "current": torch.cuda.current_device() if cuda else None,
    }
    every = gather(rt, mine)
    nodes = len({(r["host"], r["node"]) for r in every})
    if rt.device.type != "cuda":
        return Check(
            name="devices",
            status="pass",
            detail={"ranks": every},
            figure=f"{rt.world_size} rank(s) on {nodes} node(s), CPU (no GPU visible: gloo subset)",
        )
    problems = []
    seen: dict[tuple[str, str], int] = {}
    for r in every:
        expected = 0 if r["count"] == 1 else r["local_rank"]
        if r["device"] != f"cuda:{expected}":
            problems.append(f"rank {r['rank']} uses {r['device']}, expected cuda:{expected}")
        elif r["current"] != expected:  # kernels and NCCL go to torch's current device, not to rt.device
            problems.append(
                f"rank {r['rank']} trains on {r['device']} but torch's current device is cuda:{r['current']}"
            )
        key = (r["host"], r["gpu"])
        if key in seen:
            problems.append(f"ranks {seen[key]} and {r['rank']} share GPU {r['gpu']} on {r['host']}")
        seen[key] = r["rank"]
    figure = (
        f"{rt.world_size} rank(s) on {nodes} node(s), one GPU each ({', '.join(sorted({r['device'] for r in every}))})"
    )
    return Check(
        name="devices",
        status="fail" if problems else "pass",
        detail={"ranks": every},
        figure="; ".join(problems) if problems else figure,
    )


def check_allreduce(rt, sizes: str, nccl_log: str | None = None) -> Check:
    """The sum is right, and the bus bandwidth over a short sweep (bench/allreduce.py's method), against
    what the node's GPU links imply (a single-node GPU job) and with the transport NCCL picked."""
    n = rt.world_size
    t = torch.full((1 << 16,), float(rt.rank + 1), device=rt.device)
    dist.all_reduce(t)
    expected = n * (n + 1) / 2
    got = float(t[0].item()), float(t[-1].item())
    if got != (expected, expected):
        return Check(
            name="all-reduce",
            status="fail",
            figure=f"sum over {n} ranks gave {got}, expected {expected}",
            detail={"got": list(got), "expected": expected},
        )
    rows = measure(rt, sizes_for(sizes, rt.device.type), iters=20, warmup=2, budget_s=0.5)
    best = plateau(rows) or {"busbw_Bps": rows[-1]["busbw_Bps"], "reached": False, "largest_bytes": rows[-1]["bytes"]}
    at = max(rows, key=lambda r: r["busbw_Bps"])
    links = node_links(rt) if rt.device.type == "cuda" and rt.num_nodes == 1 else (None, "")
    transports = sorted({k for found in gather(rt, _transports(nccl_log)) for k in found})
    status, judged = allreduce_verdict(at["busbw_Bps"] / 1e9, *links, transports)
    note = plateau_words(best).split(":")[0]
    return Check(
        name="all-reduce",
        status=status,
        detail={"rows": rows, "plateau": best, "expected_gbps": links[0], "links": links[1], "transports": transports},
        figure=f"sum correct; bus bandwidth {at['busbw_Bps'] / 1e9:.2f} GB/s at {format_size(at['bytes'])} "
        f"({rt.backend}, {note})" + (f"; {judged}" if judged else ""),
    )


def allreduce_verdict(
    busbw_gbps: float, expected_gbps: float | None, links: str, transports: list[str]
) -> tuple[str, str]:
    """WARN when GPUs joined by NVLink reach less than ALLREDUCE_SHARE of their links' bandwidth, or
    NCCL connected them through host memory: they fell back to PCIe or SHM (P2P disabled, per-GPU
    cgroups, a driver or fabric manager problem). Anything else passes: there is no expectation."""
    shm = "SHM" in transports and "P2P" not in transports
    if expected_gbps is None:
        return "pass", (f"NCCL {'/'.join(transports)}" if transports else "")
    floor = ALLREDUCE_SHARE * expected_gbps
    if busbw_gbps < floor or shm:
        why = (
            f"NCCL connected the GPUs through host memory ({'/'.join(transports)})"
            if shm
            else f"below {floor:.0f} GB/s, half of what their links give ({links})"
        )
        return "warn", (
            f"{why}: the GPUs fell back from NVLink to PCIe or shared memory; check NCCL_P2P_DISABLE, "
            "per-GPU cgroups (srun --gpus-per-task) and nvidia-smi nvlink --status"
        )
    return "pass", f"expected >= {floor:.0f} GB/s over NVLink ({links})" + (
        f", NCCL {'/'.join(transports)}" if transports else ""
    )


def node_links(rt) -> tuple[float | None, str]:
    """(GB/s an all-reduce over the job's GPUs on this node should reach, why), from ``nvidia-smi topo -m``.
    Every rank's GPU is gathered by PCI address or UUID, which nvidia-smi's node-wide indices are found
    from: torch's indices are not the node's (``CUDA_VISIBLE_DEVICES=4,5,6,7``, srun's one GPU per task)."""
    job = gather(rt, identity(rt.device))
    text = detect.run_tool(["nvidia-smi", "topo", "-m"]) if torch.version.cuda else None
    if not text:
        return None, "no nvidia-smi topology (AMD GPUs: no expectation)"
    return job_links(
        text, detect.run_tool(["nvidia-smi", "--query-gpu=index,pci.bus_id,uuid", "--format=csv,noheader"]) or "", job
    )


def job_links(topo: str, query: str, job: list[dict]) -> tuple[float | None, str]:
    """node_links on captured outputs: ``topo`` of ``nvidia-smi topo -m``, ``query`` of ``nvidia-smi
    --query-gpu=index,pci.bus_id,uuid --format=csv,noheader``, ``job`` every rank's GPU identity. No
    expectation when nvidia-smi here does not list every GPU of the job (a cgroup hides the others)."""
    try:
        gpus, missing = node_gpu_indices(query, job)
        expected, why = expected_busbw_gbps(parse_nvidia_links(topo), gpus)
    except Exception as exc:  # an output this parser does not know: no expectation rather than a failed check
        return None, f"nvidia-smi output not understood ({exc})"
    if missing:
        return None, (
            f"nvidia-smi here does not list the job's GPU(s) {', '.join(missing)} (hidden from it, as "
            "a cgroup per task does): links unknown, no expectation"
        )
    return expected, f"GPUs {','.join(map(str, gpus))}: {why}"


def _transports(nccl_log: str | None) -> list[str]:
    try:
        return list(intra_node_transports(Path(nccl_log).read_text(errors="replace"))) if nccl_log else []
    except OSError:
        return []


def _train(rt, model: nn.Module, step_fn, steps: range, timed: bool = False) -> float:
    """Run ``step_fn(model, i)`` for each step; the mean seconds per step when ``timed`` (device waited for)."""
    rt.synchronize()
    started = time.perf_counter()
    for i in steps:
        step_fn(model, i)
    rt.synchronize()
    return (time.perf_counter() - started) / max(1, len(steps)) if timed else 0.0


def check_equivalence(rt) -> Check:
    """DDP on N ranks equals one process on the whole batch; step times of both (one warm-up step each)."""
    with exact_fp32():
        strategy = get_strategy("ddp")
        model, opt = strategy.wrap(mlp(), SGD, rt)

        def ddp_step(m, i):
            x, y = batch(i, rt)
            train_step(strategy, m, opt, nn.functional.cross_entropy(m(x), y))

        _train(rt, model, ddp_step, range(1))
        ddp_s = _train(rt, model, ddp_step, range(1, STEPS), timed=True)
        mine = params(model)
        single = mlp().to(rt.device)  # one process: the whole global batch, no process group involved
        single_opt = torch.optim.SGD(single.parameters(), lr=0.05)

        def single_step(m, i):
            x, y = batch(i, rt, whole=True)
            nn.functional.cross_entropy(m(x), y).backward()
            single_opt.step()
            single_opt.zero_grad(set_to_none=True)

        _train(rt, single, single_step, range(1))
        single_s = _train(rt, single, single_step, range(1, STEPS), timed=True)
    diff = max_rel(mine, params(single))
    worst = max(gather(rt, diff))
    mean_ddp = rt.mean(ddp_s)
    tol = tolerance(rt)
    return Check(
        name="equivalence",
        status="pass" if worst <= tol else "fail",
        detail={"max_rel": worst, "tolerance": tol, "ddp_step_s": mean_ddp, "single_step_s": single_s},
        figure=f"DDP on {rt.world_size} ranks = 1 process: max rel. diff {worst:.1e} (tol {tol:g}); "
        f"step {mean_ddp * 1e3:.1f} ms on {rt.world_size} ranks vs {single_s * 1e3:.1f} ms "
        f"for the whole batch on 1",
    )


def check_strategies(rt, skip: set[str]) -> Check:
    """ZeRO-1 equals DDP bitwise; FSDP (and DeepSpeed when installed) within the tolerance."""
    names = ["ddp", "zero1", "fsdp"]
    if "deepspeed" not in skip and importlib.util.find_spec("deepspeed") is not None:
        names.append("deepspeed")
    results = {}
    with exact_fp32():
        for name in names:
            strategy = get_strategy(name).with_batch(global_batch(rt.world_size) // rt.world_size)
            model, opt = strategy.wrap(mlp(), SGD, rt)
            for i in range(STEPS):
                x, y = batch(i, rt)
                train_step(strategy, model, opt, nn.functional.cross_entropy(model(x), y))
            results[name] = _full_params(strategy, model, opt)
    ddp, tol = results["ddp"], tolerance(rt)
    zero1_exact = all(torch.equal(ddp[k], results["zero1"][k]) for k in ddp)
    diffs = {name: max_rel(results[name], ddp) for name in names if name not in ("ddp", "zero1")}
    ok = zero1_exact and all(d <= tol for d in diffs.values())
    parts = ["zero1 = ddp bitwise" if zero1_exact else "zero1 differs from ddp"]
    parts += [f"{name} {d:.1e}" for name, d in diffs.items()]
    if "deepspeed" not in names:
        parts.append("deepspeed " + ("skipped" if "deepspeed" in skip else "not installed"))
    return Check(
        name="strategies",
        status="pass" if ok else "fail",
        detail={"max_rel": diffs, "tolerance": tol},
        figure=f"{', '.join(parts)} (tol {tol:g})",
    )


def _full_params(strategy, model, opt) -> dict[str, torch.Tensor]:
    """Every parameter, whole, as fp32 on the CPU of every rank (gathered for sharded strategies)."""
    return {k: v.detach().float().cpu().clone() for k, v in strategy.full_model_state(model).items()}


def train_step(strategy, model: nn.Module, opt, loss: torch.Tensor) -> None:
    """One optimizer step the strategy's way (loss scaling, DeepSpeed's engine)."""
    strategy.backward_loss(loss, model)
    strategy.micro_step(opt, model, last=True)


def check_resume(rt, workdir: Path, deterministic: bool) -> Check:
    """Train 2K steps with a checkpoint at K; a fresh model resumed from it must end where the
    uninterrupted run ended (dropout on: the RNG state, CPU and GPU, is part of the resume)."""
    start = rng_state(rt.device)
    directory = workdir / "resume"
    strategy = get_strategy("ddp")

    def step(m, i, opt):
        x, y = batch(i, rt)
        train_step(strategy, m, opt, nn.functional.cross_entropy(m(x), y))

    model, opt = strategy.wrap(mlp(dropout=0.1), SGD, rt)
    ckpt = Checkpointer(directory, rt, strategy=strategy)
    for i in range(2 * STEPS):
        step(model, i, opt)
        if i + 1 == STEPS:
            ckpt.save(
                STEPS, {"model": strategy.checkpoint_state(model, opt), "step": STEPS, "rng": RNGState(rt.device)}
            )
    uninterrupted = params(model)

    set_rng_state(start, rt.device)  # the resumed run must not inherit this process's RNG position
    fresh = mlp(dropout=0.1)
    with torch.no_grad():
        for p in fresh.parameters():
            p.add_(1.0)  # other weights: only the checkpoint can make this run match
    model, opt = strategy.wrap(fresh, SGD, rt)
    Checkpointer(directory, rt, strategy=strategy).restore(
        {"model": strategy.checkpoint_state(model, opt), "rng": RNGState(rt.device)}
    )
    x, y = batch(0, rt)
    strategy.after_resume(model, lambda: nn.functional.cross_entropy(model(x), y).backward())
    for i in range(STEPS, 2 * STEPS):
        step(model, i, opt)
    resumed = params(model)
    exact_expected = rt.device.type == "cpu" or deterministic
    exact = all(gather(rt, all(torch.equal(uninterrupted[k], resumed[k]) for k in uninterrupted)))
    diff = max(gather(rt, max_rel(resumed, uninterrupted)))
    tol = 0.0 if exact_expected else 1e-5
    ok = exact if exact_expected else diff <= tol
    how = "bitwise" if exact else f"max rel. diff {diff:.1e}"
    promise = "bitwise expected" if exact_expected else f"tol {tol:g} (deterministic mode off)"
    return Check(
        name="resume",
        status="pass" if ok else "fail",
        detail={"bitwise": exact, "max_rel": diff},
        figure=f"{how} after {STEPS}+{STEPS} steps from a checkpoint, dropout on ({promise})",
    )


def check_breakdown(rt, allreduce: dict | None = None) -> Check:
    """The step records (observe/hooks.py, the one clock of a step) see the gradient all-reduce (on NCCL, through
    CUDA events) as long as the measured bus bandwidth says it takes; ``allreduce``: the all-reduce check's result
    (its rows). A recorder of its own, in a directory of its own, records the check's steps."""
    strategy = get_strategy("ddp:comm_hook=none")  # the backend's all-reduce: what the all-reduce check timed
    torch.manual_seed(7)
    layers = [nn.Linear(BREAKDOWN_WIDTH, BREAKDOWN_WIDTH) for _ in range(BREAKDOWN_LAYERS)]
    model, opt = strategy.wrap(nn.Sequential(*layers), OptimizerSpec(torch.optim.SGD, {"lr": 1e-4}), rt)
    with tempfile.TemporaryDirectory(prefix="trainscale-selftest-") as tmp:
        recorder = Recorder(
            tmp, environ={**os.environ, "TRAINSCALE_SAMPLE_INTERVAL": "0", "TRAINSCALE_STRAGGLER_EVERY": "0"}
        ).install()
        try:
            for i in range(STEPS):
                x = torch.randn(8, BREAKDOWN_WIDTH, generator=torch.Generator().manual_seed(i)).to(rt.device)
                strategy.backward_loss(model(x).square().mean(), model)
                strategy.micro_step(opt, model, last=True)
        finally:
            recorder.finish()
        stats = rank_stats(rt.rank, list(read_lines(metrics_dir(tmp) / f"rank-{rt.rank}.jsonl")))
    shares = stats.shares if stats is not None else {}
    keys = ("compute", "backward", "comm", "optimizer")
    per_step = dict(
        zip(("compute", "backward", "communication", "optimizer"), rt.means([float(shares.get(k, 0.0)) for k in keys]))
    )
    gradient_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    implied = implied_comm_s(gradient_bytes, rt.world_size, allreduce)
    status, why = breakdown_verdict(per_step, implied, gpu=rt.device.type != "cpu")
    return Check(
        name="breakdown",
        status=status,
        detail={**per_step, "implied_s": implied},
        figure=f"communication exposed {per_step['communication'] * 1e3:.2f} ms/step, backward "
        f"{per_step['backward'] * 1e3:.2f} ms, forward {per_step['compute'] * 1e3:.2f} ms"
        + (f" (the bus bandwidth implies {implied * 1e3:.2f} ms)" if implied else "")
        + (f": {why}" if why else ""),
    )


def implied_comm_s(gradient_bytes: int, world_size: int, allreduce: dict | None) -> float | None:
    """Seconds a ring all-reduce of ``gradient_bytes`` takes at the bus bandwidth the all-reduce check
    measured at the nearest size to DDP's 25 MB bucket: bytes x 2(n-1)/n / busbw."""
    rows = [r for r in (allreduce or {}).get("detail", {}).get("rows", []) if r.get("busbw_Bps", 0) > 0]
    if not rows or world_size < 2:
        return None
    busbw = nearest_row({"rows": rows}, min(gradient_bytes, 25 * 2**20))["busbw_Bps"]
    return gradient_bytes * 2 * (world_size - 1) / world_size / busbw


def breakdown_verdict(per_step: dict[str, float], implied_s: float | None, *, gpu: bool) -> tuple[str, str]:
    """FAIL when the step records measure no exposed communication, or, on GPUs, when backward and the exposed
    communication together (the all-reduce runs within them) take less than BREAKDOWN_SHARE of what the bus
    bandwidth implies (the marks would then time work queued, not done); WARN when there is no bandwidth to
    compare with. On CPU ranks the shortfall is a WARN: their all-reduce and training share the cores, so the
    bandwidth measured alone varies with the load (on 2 cores shared by 4 ranks it implied 145 ms where training
    saw 66 ms)."""
    exposed, seen = per_step["communication"], per_step["communication"] + per_step["backward"]
    if exposed <= 0:
        return "fail", "the step records measured no exposed communication"
    if implied_s is None:
        return "warn", "no bus bandwidth to compare with (the all-reduce check did not run)"
    if seen < BREAKDOWN_SHARE * implied_s:
        return "fail" if gpu else "warn", (
            f"backward and the communication take less than {BREAKDOWN_SHARE:.0%} "
            "of that: the step records miss communication"
        )
    return "pass", ""
