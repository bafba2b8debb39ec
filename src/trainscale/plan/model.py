"""``trainscale plan``: before an allocation is spent, the memory each rank needs under every strategy and the step
time, speedup and efficiency at 1…N ranks — from one short calibration run of the script or workload as it is
(observe/state.py counts its parameters, gradients, optimizer state and activations; the recorder its step
phases). Pure: the calibration's records in, the plan out.

The memory model is ZeRO's (Rajbhandari et al., 2020) on the measured bytes: DDP holds everything on every rank
(and a bucket copy of the gradients), ZeRO-1 shards the optimizer state, ZeRO-2 the gradients too, ZeRO-3 and
FSDP the parameters too; activations scale with the per-rank batch. The time model: the calibration's phases,
slowed where ranks share cores, and each strategy's collectives (plan/comm.py) as measured where the ranks
run or as a ring all-reduce over the interconnect, DDP's overlapped with backward (docs/scaling.md).
Every figure says what it was calibrated on; what the model cannot see is listed with the figures.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from trainscale.errors import ConfigError
from trainscale.observe.reading import steady
from trainscale.plan.comm import (
    Network,
    Sweep,
    bucket_count,
    collectives,
    ring_allreduce_s,
    sharded_comm_s,
    whole_tensor_share,
)

STRATEGIES = ("ddp", "zero1", "deepspeed:stage=1", "deepspeed:stage=2", "fsdp", "deepspeed:stage=3")
"""Least sharding first: the first that fits is the recommendation (less sharding, less communication)."""
DATA_SHARE = 0.05
"""A data wait above this share of the step asks for DataLoader workers."""
MARGIN = 0.10
STEP_KEYS = ("step_s", "uncertain")
"""What a strategy's row in the plan's JSON says of its step at the planned ranks (``uncertain``: no step time
can be said, and why; the figure is the model's all the same)."""
NOISY = 3.0
"""The calibration's 90th-percentile step over its 10th beyond which its band predicts nothing (said instead)."""
ANY_BATCH = 2**16
"""Samples per rank from which the memory no longer bounds the batch in any training: said as "any batch"."""
"""Memory kept free for what the model does not count (the allocator's slack, kernels' workspaces)."""
GPU_RUNTIME_BYTES = 1 << 30
"""On a GPU, beyond the margin: what CUDA's max_memory_allocated never counts, the CUDA context (~0.5 GiB with
torch's lazy module loading on an H100), cuBLAS's workspaces and NCCL's buffers (NCCL_BUFFSIZE, 4 MiB, per
channel and peer). The allocator's cached blocks are measured (:attr:`Calibration.reserve`)."""
UNSEEN = (
    "the allocator's slack and fragmentation, and a custom kernel's workspace (kept free by a 10% margin)",
    "FSDP and ZeRO-3 gather one unit's full parameters at a time, and prefetch the next: the peak charges "
    "all of them, an upper bound",
    "activation checkpointing or offloading the script does inside its own code (counted as it ran)",
    "an evaluation the script runs between its training steps (its own batch, its own peak)",
    "ZeRO's and DeepSpeed's own bookkeeping, and FSDP's per-unit work in a script (a workload's FSDP pace is "
    "its own calibration's, over a group of one): their times charge their collectives only",
    "where no all-reduce was measured among the planned ranks (CPU ranks here are): the fixed cost of each "
    "of a sharded strategy's many collectives, and within a node the node's own links (NVLink, shared "
    "memory), faster than the interconnect the times charge",
)


BACKWARD_SHARE = 2 / 3
"""Share of forward + backward spent in backward (backward ~ 2x forward): what DDP's all-reduces can hide behind."""


@dataclass(frozen=True)
class Phases:
    """One rank's median step, in seconds: what the time model scales."""

    data_s: float
    compute_s: float
    """Forward and backward."""
    optimizer_s: float
    other_s: float
    """The rest of the step (Python, bookkeeping): constant per step."""
    batch: int

    @property
    def step_s(self) -> float:
        return self.data_s + self.compute_s + self.optimizer_s + self.other_s


@dataclass(frozen=True)
class Calibration:
    """What the calibration run measured on one rank."""

    params: int
    grads: int
    optimizer: int
    activations: int
    """Bytes the forward kept for backward at ``batch`` samples."""
    batch: int
    steps: list[dict]
    """The step records after the first (the first pays for warm-up)."""
    dtypes: tuple[str, ...] = ()
    groups: tuple[tuple[int, ...], ...] = ()
    """Each optimizer parameter group's parameter sizes (elements), for ZeRO-1's whole-tensor partitions."""
    device: str = "cpu"
    strategy: str | None = None
    """What wrapped the script's model, as the recorder saw it (observe/models.strategy_of): ddp, fsdp, ..."""
    setup: str | None = None
    """The strategy the script asked ``rt.setup`` for (which wraps nothing on one rank), or None."""
    setup_hook: str | None = None
    """What that strategy's DDP averages gradients with (its ``comm_hook``: ``auto`` is shared memory on one
    node's CPUs), or None."""
    threads: int = 1
    """CPU threads the calibration's rank ran (on CPU: the cores it used)."""
    recorded: int = 0
    """Step records the calibration wrote (its warm-up included)."""
    peak: int | None = None
    """The calibration rank's peak memory over its steps (its summary: CUDA's max_memory_allocated, or the
    process's peak RSS)."""
    reserve: int = 0
    """On a GPU, what CUDA's caching allocator held beyond its allocations at the calibration's peak
    (max_memory_reserved - max_memory_allocated): cached and fragmented blocks, memory the GPU does not have free."""
    units: tuple[int, ...] = ()
    """Parameter bytes of each unit FSDP and ZeRO-3 gather at a time (observe/models.shard_units), the root's
    own last; a unit without parameters of its own gathers nothing and is left out."""

    @property
    def overhead(self) -> float:
        """What the peak held beyond the counted state and activations: the runtime (on CPU the interpreter and
        its libraries), the step's temporaries. Carried unchanged to every configuration (0 when not measured)."""
        if not self.peak:
            return 0.0
        return max(0.0, self.peak - (self.params + self.grads + self.optimizer + self.activations))

    @classmethod
    def from_records(cls, records: list[dict]) -> Calibration:
        state = next((r for r in records if r.get("kind") == "state"), None)
        meta = next((r for r in records if r.get("kind") == "meta"), {})
        steps = [r for r in records if r.get("kind") == "step" and r.get("step_s")]
        if state is None or not state.get("params_bytes"):
            raise ConfigError(
                "the calibration run recorded no optimizer step with parameters",
                hint="plan needs a script that trains (a torch optimizer's step); its own output above "
                "says why it stopped",
            )
        if len(steps) < 2:
            raise ConfigError(f"the calibration run recorded {len(steps)} step(s)", hint="give it more: --steps 10")
        batch = int(state.get("activation_samples") or steps[-1].get("samples") or 1)
        summary = next((r for r in records if r.get("kind") == "summary"), {})
        return cls(
            params=int(state["params_bytes"]),
            grads=int(state["grads_bytes"]),
            optimizer=int(state["optimizer_bytes"]),
            activations=int(state["activation_bytes"]),
            batch=batch,
            steps=steady(steps),
            dtypes=tuple(state.get("param_dtypes") or ()),
            groups=tuple(tuple(int(n) for n in g) for g in state.get("param_groups") or ()),
            device=str(meta.get("device", "cpu")),
            threads=int(meta.get("threads") or 1),
            strategy=meta.get("strategy"),
            setup=meta.get("setup"),
            setup_hook=meta.get("setup_hook"),
            recorded=len(steps),
            peak=summary.get("steps_peak_mem_bytes") or summary.get("peak_mem_bytes") or None,
            reserve=max(0, int(summary.get("reserved_peak_bytes") or 0) - int(summary.get("peak_mem_bytes") or 0)),
            units=tuple(int(b) for b in meta.get("unit_bytes") or () if int(b) > 0),
        )

    def tensor_bytes(self) -> list[float]:
        """Each parameter tensor's bytes (the optimizer's groups' sizes at the parameters' mean element size)."""
        sizes = [n for group in self.groups for n in group]
        element = self.params / max(1, sum(sizes))
        return [n * element for n in sizes]

    def modelled_strategy(self) -> str:
        """The plan's name for the strategy the calibrated script used (ddp's model for an unwrapped one)."""
        name = self.strategy if self.strategy not in (None, "none") else self.setup or "ddp"
        if name.startswith("deepspeed zero"):
            return f"deepspeed:stage={name.removeprefix('deepspeed zero')}"
        return name if name in STRATEGIES else "ddp"

    def measured(self) -> Phases:
        """The median step's phases."""

        def median(key: str) -> float:
            return statistics.median(float(r.get(key) or 0.0) for r in self.steps)

        data, forward, backward, optimizer = (median(k) for k in ("data_s", "compute_s", "backward_s", "optimizer_s"))
        step = median("step_s")
        other = max(0.0, step - data - forward - backward - optimizer)
        return Phases(data, forward + backward, optimizer, other, self.batch)

    def spread(self) -> tuple[float, float]:
        """The step's 10th and 90th percentile over the median: how far one calibration's pace can be trusted."""
        times = sorted(float(r["step_s"]) for r in self.steps)
        mid = statistics.median(times)
        low, high = times[int(0.1 * (len(times) - 1))], times[int(round(0.9 * (len(times) - 1)))]
        return low / mid, high / mid

    def slowest_of(self, ranks: int) -> float:
        """The median step of ``ranks`` ranks that each run at this calibration's pace and wait for one another
        every step, over its own median: a step lasts as long as its slowest rank's, whose median is the
        calibration's ``0.5 ** (1 / ranks)`` quantile (the 71st percentile for 2 ranks, the 84th for 4), each
        rank's time its own draw. 1 for one rank."""
        if ranks <= 1 or len(self.steps) < 3:
            return 1.0
        times = sorted(float(r["step_s"]) for r in self.steps)
        at = 0.5 ** (1.0 / ranks) * (len(times) - 1)
        below = int(at)
        above = min(below + 1, len(times) - 1)
        quantile = times[below] + (times[above] - times[below]) * (at - below)
        return max(1.0, quantile / statistics.median(times))

    @property
    def noisy(self) -> bool:
        """Its steps varied too much (:data:`NOISY`) for a band around them to mean anything."""
        low, high = self.spread()
        return high > NOISY * low


@dataclass(frozen=True)
class Memory:
    strategy: str
    params: float
    grads: float
    optimizer: float
    activations: float
    buffers: float
    """DDP's gradient buckets (a copy of the gradients)."""
    gathered: float = 0.0
    """FSDP's and ZeRO-3's parameters gathered for a block's forward and backward (all of them: an upper bound)."""
    overhead: float = 0.0
    """The calibration's peak beyond its counted bytes (Calibration.overhead)."""

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.activations + self.buffers

    @property
    def held(self) -> float:
        """Parameters, gradients and optimizer state: what a run's own memory table shows per rank."""
        return self.params + self.grads + self.optimizer

    @property
    def peak(self) -> float:
        """The rank's predicted peak: the total, the gathered parameters and the calibration's overhead."""
        return self.total + self.gathered + self.overhead


def memory(cal: Calibration, strategy: str, world: int, batch: int, overhead: bool = True) -> Memory:
    """Bytes one rank holds under ``strategy`` at ``world`` ranks and ``batch`` samples per rank; ``overhead``:
    its peak carries the calibration's (not where the calibration's memory is not the target's: a CPU's RSS
    for a GPU)."""
    from trainscale.strategies import state_sharding  # noqa: PLC0415 (torch-free module)

    if strategy not in STRATEGIES:
        raise ConfigError(f"strategy {strategy!r} is not one plan models", hint=", ".join(STRATEGIES))
    n = max(1, world)
    shard = state_sharding(strategy)  # the strategy's own account of what it divides over the ranks
    p, g, o = float(cal.params), float(cal.grads), float(cal.optimizer)
    act = cal.activations * batch / max(1, cal.batch)
    buckets = g if shard.buckets and n > 1 else 0.0
    optimizer = o / (n if shard.optimizer else 1)
    if shard.whole_tensors and n > 1 and cal.groups:  # torch's ZeRO-1 keeps tensors whole: its fullest rank
        optimizer = o * whole_tensor_share(cal.groups, n)
    gathered = p * (n - 1) / n if shard.params else 0.0
    return Memory(
        strategy,
        p / (n if shard.params else 1),
        g / (n if shard.grads else 1),
        optimizer,
        act,
        buckets,
        gathered,
        cal.overhead if overhead else 0.0,
    )


@dataclass
class Plan:
    calibration: Calibration
    what: str
    """The script or workload."""
    ranks_per_node: int
    nodes: int
    batch: int
    device_bytes: float | None
    """Memory one rank may use (a GPU's, or the node's share per rank); None: not known."""
    device_source: str
    network: Network
    network_source: str
    memory: list[Memory] = field(default_factory=list)
    times: list[dict] = field(default_factory=list)
    recommended: str | None = None
    unseen: tuple[str, ...] = UNSEEN
    target_gpus: bool = False
    """The plan is for GPUs (a GPU profile): a CPU calibration's times are not theirs, and it says so."""
    cpus_per_rank: int | None = None
    """CPUs each rank gets (the profile's usable cores per node, or this machine's, over the ranks per node)."""
    shared_cores: int | None = None
    """CPU ranks planned on this machine share its cores (make_plan)."""
    verified: list[dict] = field(default_factory=list)
    """``--verify``: the cheapest configurations run here, predicted against measured (plan/calibrate.py)."""
    own: dict[str, Calibration] = field(default_factory=dict)
    """A strategy's own one-rank calibration (fsdp sharded over a group of one: its per-unit work), where one
    was run; the others' times and peaks are the plain calibration's."""
    sweeps: list[Sweep] = field(default_factory=list)
    """All-reduces measured where the ranks will run (CPU ranks here): at a world size with one, the
    collectives cost what it measured, not the network's model. The backend's (none) prices the sharded
    strategies' collectives, and DDP's all-reduce where no shm sweep was measured (a script's own DDP)."""

    def predict(self, ranks: int, nodes: int = 1, strategy: str = "ddp", batch: int | None = None) -> dict:
        """Step time, band, speedup and efficiency at ``ranks`` over ``nodes`` under ``strategy``, ``batch``
        samples per rank (default: the calibration's): its phases, slowed where ranks share cores and paced by
        the slowest of the ranks each step (:meth:`Calibration.slowest_of`), with the
        strategy's collectives (:func:`collectives`) and, where the strategy shards the optimizer state, each rank
        stepping only its share; the data wait and the compute scale with the batch."""
        from trainscale.strategies import state_sharding  # noqa: PLC0415 (torch-free module)

        cal = self.calibration
        # the strategy's own pace where it was calibrated (alone, fsdp runs unwrapped: the plain pace)
        timed = self.own.get(strategy, cal) if ranks > 1 else cal
        measured, (low, high) = timed.measured(), timed.spread()
        plain = cal.measured()
        if batch and batch != measured.batch:
            work = batch / measured.batch
            measured, plain = (
                replace(m, data_s=m.data_s * work, compute_s=m.compute_s * work, batch=batch) for m in (measured, plain)
            )
        # within one node the collectives do not cross the interconnect; the model charges it anyway (stated)
        on_node = ranks // nodes
        contention = max(1.0, on_node * cal.threads / self.shared_cores) if self.shared_cores else 1.0
        grads, params_hidden, params_exposed = collectives(strategy)
        share = memory(cal, strategy, ranks, measured.batch).optimizer / cal.optimizer if cal.optimizer else 1.0
        # measured where the ranks run: every collective as measured, none on the network (a study measures only
        # what its strategy takes: the other strategies' collectives then go by the one sweep it has)
        # shared memory averages on one node only (comm_hook=auto takes none across nodes)
        shm = self.sweep(ranks, "shm") if nodes == 1 else None
        sweep = self.sweep(ranks) or shm
        if sweep is not None:
            grads = params_hidden = 0.0
        hidden = int(grads * cal.grads + params_hidden * cal.params)
        host = replace(
            measured,
            data_s=measured.data_s * contention,
            compute_s=measured.compute_s * contention,
            optimizer_s=measured.optimizer_s * share * contention,
            other_s=measured.other_s * contention,
        )
        # a bucket's all-reduce starts when its last gradient is ready: the last bucket's never hides
        buckets = max(1, bucket_count(hidden))
        overlapped = ring_allreduce_s(hidden, ranks, self.network, buckets)
        window = BACKWARD_SHARE * host.compute_s * (buckets - 1) / buckets
        exposed = max(0.0, overlapped - window)
        if sweep is not None:  # DDP's all-reduce by the path it takes (synchronous on busy cores: exposed)
            ddp = shm or sweep
            averaged = ddp.seconds(cal.grads) if state_sharding(strategy).buckets else 0.0
            exposed += averaged + sharded_comm_s(strategy, cal, sweep.seconds)
        elif ranks > 1:  # the network's model: the exposed bytes (a collective's fixed cost is not modelled: UNSEEN)
            exposed += ring_allreduce_s(params_exposed * cal.params, ranks, self.network)
        slowest = timed.slowest_of(ranks)
        own_work = host.step_s * slowest
        step = own_work + exposed
        uncertain = None
        if contention > 1 and sweep is not None and exposed > own_work:
            # ranks sharing cores wait in each collective for ranks the scheduler has not run yet: where that
            # measured wait is most of the step, the cores' interleaving sets it, which no one-rank calibration sees
            uncertain = (
                f"{on_node} ranks share {self.shared_cores} core(s) and the collectives measured among them "
                f"({exposed * 1e3:.1f} ms a step) outweigh the ranks' own work ({own_work * 1e3:.1f} ms): "
                "the scheduler's interleaving of the ranks sets the step"
            )
        speedup = ranks * plain.step_s / step  # samples per second over one rank's, the per-rank batch the same
        return {
            "ranks": ranks,
            "nodes": nodes,
            "strategy": strategy,
            "step_s": step,
            "band_s": [step * low, step * high],
            "exposed_comm_s": exposed,
            "slowest_rank_pace": slowest,
            "speedup": speedup,
            "efficiency": speedup / ranks,
            "samples_per_s": ranks * measured.batch / step,
            "uncertain": uncertain,
        }

    def sweep(self, ranks: int, hook: str = "none") -> Sweep | None:
        return next((w for w in self.sweeps if w.ranks == ranks and w.hook == hook), None)

    def data_share(self) -> float:
        """The calibration's data wait as a share of its median step."""
        steps = self.calibration.steps
        step = statistics.median(float(r["step_s"]) for r in steps)
        return statistics.median(float(r.get("data_s") or 0.0) for r in steps) / step if step > 0 else 0.0

    def workers(self) -> int:
        """DataLoader workers per rank: none while the data wait is small (they cost the rank's cores), else the
        rank's CPUs less the training process's, at most 4 (more rarely pays: docs/scaling.md)."""
        if self.cpus_per_rank is None or self.data_share() < DATA_SHARE:
            return 0
        return max(0, min(4, self.cpus_per_rank - 1))

    @property
    def world(self) -> int:
        return self.ranks_per_node * self.nodes

    @property
    def same_memory(self) -> bool:
        """Whether the calibration measured the memory the plan is for (not a CPU's for a GPU profile)."""
        return not (self.target_gpus and not self.calibration.device.startswith("cuda"))

    def rank_memory(self, strategy: str, world: int, batch: int) -> Memory:
        """:func:`memory`, its peak carrying the calibration's overhead where that is the target's memory."""
        m = memory(self.calibration, strategy, world, batch, overhead=self.same_memory)
        own = self.own.get(strategy) if world > 1 else None  # alone, fsdp runs unwrapped: the plain peak
        return replace(m, overhead=own.overhead) if own is not None and self.same_memory else m

    @property
    def room(self) -> float | None:
        """What a rank's predicted peak may reach: the device's memory less the margin and, on a GPU, less what
        max_memory_allocated does not count (the runtime's constant, the calibration's allocator reserve)."""
        if self.device_bytes is None:
            return None
        on_gpu = self.calibration.device.startswith("cuda")
        allowance = GPU_RUNTIME_BYTES + (self.calibration.reserve if on_gpu else 0) if self.target_gpus or on_gpu else 0
        return self.device_bytes * (1 - MARGIN) - allowance

    def fits(self, m: Memory) -> bool | None:
        """The rank's predicted peak within the room (None: the room is not known)."""
        return None if self.room is None else m.peak <= self.room

    def verdict(self, m: Memory) -> str:
        """yes (within the room less its margin), tight (within the room, not its margin: what the model does not
        count may not fit), NO, or ? (the room is not known)."""
        if self.device_bytes is None:
            return "?"
        return "yes" if self.fits(m) else "tight" if m.peak <= self.device_bytes else "NO"

    def largest_batch(self, strategy: str) -> int | None:
        """The largest per-rank batch, a power of two, whose memory under ``strategy`` fits the room with its
        margin (activations grow with the batch, the state does not); 0 when not even the state fits, None when
        the room is not known."""
        if self.device_bytes is None:
            return None
        cal, room = self.calibration, self.room
        fixed = self.rank_memory(strategy, self.world, 0).peak
        per_sample = cal.activations / max(1, cal.batch)
        if fixed > room:
            return 0
        most = int((room - fixed) / per_sample) if per_sample > 0 else 2**20
        return 1 << (most.bit_length() - 1) if most >= 1 else 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "what": self.what,
            "ranks_per_node": self.ranks_per_node,
            "nodes": self.nodes,
            "batch": self.batch,
            "device_bytes": self.device_bytes,
            "device_source": self.device_source,
            "network": asdict(self.network),
            "network_source": self.network_source,
            "calibration": {k: v for k, v in asdict(self.calibration).items() if k != "steps"}
            | {"steps": len(self.calibration.steps)},
            "memory": [
                asdict(m)
                | {
                    "total": m.total,
                    "held": m.held,
                    "peak": m.peak,
                    "fits": self.fits(m),
                    "verdict": self.verdict(m),
                    **{k: v for k, v in self.predict(self.world, self.nodes, m.strategy).items() if k in STEP_KEYS},
                }
                for m in self.memory
            ],
            "times": self.times,
            "times_from": self.calibration.device,
            "for_gpus": self.target_gpus,
            "cpus_per_rank": self.cpus_per_rank,
            "dataloader_workers": self.workers(),
            "data_share": self.data_share(),
            "recommended": self.recommended,
            "recommended_batch": self.recommended_batch(),
            "not_counted": list(self.unseen),
            "verified": self.verified,
            "collectives_measured": [asdict(w) for w in self.sweeps],
            "own_calibrations": {
                name: {"step_s": c.measured().step_s, "peak": c.peak, "steps": len(c.steps), "strategy": c.strategy}
                for name, c in self.own.items()
            },
        }

    def recommended_batch(self) -> dict[str, Any] | None:
        """Per-rank batch: the largest that fits under the recommended strategy (or, where nothing fits at the
        planned batch, under the least sharding that fits some batch), and what it does to the global batch."""
        order = [self.recommended] if self.recommended else [m.strategy for m in self.memory]
        for strategy in order:
            most = self.largest_batch(strategy)
            if most is None:
                return None
            if most >= ANY_BATCH:  # the memory does not bound it: the dataset and the optimisation do
                return {"strategy": strategy, "largest": None, "any": True, "global": None}
            if most >= 1:
                return {"strategy": strategy, "largest": most, "global": most * self.world}
        return {"strategy": None, "largest": 0, "global": 0}


def ladder(ranks_per_node: int, nodes: int) -> list[tuple[int, int]]:
    """(ranks, nodes) from one rank up: powers of two within a node, then whole nodes doubling to ``nodes``."""
    out, n = [], 1
    while n < ranks_per_node:
        out.append((n, 1))
        n *= 2
    m = 1
    while True:
        out.append((ranks_per_node * m, m))
        if m >= nodes:
            return out
        m = min(m * 2, nodes)


def make_plan(
    cal: Calibration,
    *,
    what: str,
    ranks_per_node: int,
    nodes: int,
    batch: int | None,
    device_bytes: float | None,
    device_source: str,
    network: Network,
    network_source: str,
    target_gpus: bool = False,
    shared_cores: int | None = None,
    cpus_per_rank: int | None = None,
    own: dict[str, Calibration] | None = None,
    sweeps: list[Sweep] | None = None,
) -> Plan:
    """``shared_cores``: CPU ranks planned on this machine's cores, the calibration's rank having used
    ``cal.threads`` of them: more ranks share them (they slow each other), so 2 ranks on the 2 cores one
    rank used are not 2x faster."""
    batch = batch or cal.batch
    plan = Plan(
        cal,
        what,
        ranks_per_node,
        nodes,
        batch,
        device_bytes,
        device_source,
        network,
        network_source,
        target_gpus=target_gpus,
        cpus_per_rank=cpus_per_rank,
        shared_cores=shared_cores,
        own=dict(own or {}),
        sweeps=list(sweeps or []),
    )
    plan.memory = [plan.rank_memory(s, plan.world, batch) for s in STRATEGIES]
    fitting = [m for m in plan.memory if plan.fits(m) is not False]
    plan.recommended = fitting[0].strategy if fitting else None  # the least sharding that fits (the table
    # shows each strategy's predicted step: where the optimizer step is long, ZeRO-1's shorter one may pay)
    plan.times = [
        plan.predict(ranks, used_nodes, plan.recommended or "ddp")
        for ranks, used_nodes in ladder(ranks_per_node, nodes)
    ]
    return plan
