"""Predict DDP step time, speedup and efficiency at many ranks from one measured rank. Pure.

The model, its assumptions, the contention factor for ranks that share hardware and the calibration
with measured runs: docs/scaling.md, "The projection model" and "Validation and calibration on this
machine".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from trainscale.errors import ConfigError, did_you_mean

MiB = 1024 * 1024


@dataclass(frozen=True, kw_only=True)
class Interconnect:
    """A network preset: what a ring all-reduce can use per node."""

    name: str
    """Preset name (``--interconnect``)."""
    link_gbit: float
    """Line rate of one link (NIC) in Gbit/s, one direction."""
    links_per_node: int
    """Links a node's ranks share in an all-reduce (NCCL spreads its rings over them)."""
    efficiency: float
    """Fraction of the line rate an all-reduce reaches (an assumption; see docs/scaling.md)."""
    latency_us: float
    """Per ring step latency in microseconds."""
    max_ranks: int | None = None
    """Largest all-reduce the preset describes (one NVLink domain); None: any."""
    source: str = ""
    """Where the line rate comes from."""

    def __post_init__(self) -> None:
        if self.link_gbit <= 0 or self.links_per_node < 1 or not 0 < self.efficiency <= 1 or self.latency_us < 0:
            raise ConfigError(f"interconnect {self.name!r}: rate {self.link_gbit} Gbit/s x {self.links_per_node}, "
                              f"efficiency {self.efficiency}, latency {self.latency_us} us",
                              hint="rate > 0, links >= 1, 0 < efficiency <= 1, latency >= 0")

    @property
    def busbw_Bps(self) -> float:
        return self.link_gbit * 1e9 / 8 * self.links_per_node * self.efficiency

    def network(self) -> "Network":
        return Network(name=self.name, busbw_Bps=self.busbw_Bps, latency_s=self.latency_us * 1e-6,
                       max_ranks=self.max_ranks)


PRESETS: dict[str, Interconnect] = {i.name: i for i in (
    Interconnect(name="ethernet-25g", link_gbit=25, links_per_node=1, efficiency=0.85, latency_us=30,
                 source="IEEE 802.3by 25GBASE line rate; TCP sockets"),
    Interconnect(name="ib-hdr200", link_gbit=200, links_per_node=1, efficiency=0.92, latency_us=5,
                 source="InfiniBand HDR 200 Gb/s (ConnectX-6); 8 per node on DGX A100: --links-per-node 8"),
    Interconnect(name="ib-ndr400", link_gbit=400, links_per_node=1, efficiency=0.90, latency_us=5,
                 source="InfiniBand NDR 400 Gb/s (ConnectX-7); 8 per node on DGX H100: --links-per-node 8"),
    Interconnect(name="slingshot-11", link_gbit=200, links_per_node=4, efficiency=0.80, latency_us=10,
                 source="HPE Slingshot-11 200 Gb/s NICs, 4 per LUMI-G node (one per MI250X)"),
    Interconnect(name="nvlink-a100", link_gbit=2400, links_per_node=1, efficiency=0.77, latency_us=3, max_ranks=8,
                 source="NVLink 3: 12 links x 25 GB/s per direction = 300 GB/s per A100; one 8-GPU node"),
)}


@dataclass(frozen=True, kw_only=True)
class Network:
    """Bus bandwidth and latency an all-reduce sees (from a preset or measured)."""

    name: str
    """Preset name or ``measured``."""
    busbw_Bps: float
    """All-reduce bus bandwidth, bytes per second (nccl-tests' definition)."""
    latency_s: float = 0.0
    """Per ring step latency."""
    max_ranks: int | None = None
    """Largest rank count this network describes."""

    def __post_init__(self) -> None:
        if not self.busbw_Bps > 0 or self.latency_s < 0:
            raise ConfigError(f"network {self.name!r}: busbw {self.busbw_Bps} B/s, latency {self.latency_s} s",
                              hint="bus bandwidth must be > 0 and latency >= 0")


def get_preset(name: str, links_per_node: int | None = None) -> Interconnect:
    if name not in PRESETS:
        raise ConfigError(f"unknown interconnect {name!r}", hint=did_you_mean(name, list(PRESETS)))
    preset = PRESETS[name]
    if links_per_node is None:
        return preset
    from dataclasses import replace

    return replace(preset, links_per_node=links_per_node)


@dataclass(frozen=True, kw_only=True)
class Measured:
    """One rank's measured per-step times (seconds) and what it all-reduces."""

    data_s: float
    """Fetching the batch."""
    compute_s: float
    """Forward + backward (no communication: one rank)."""
    optimizer_s: float
    """Optimizer step and zero_grad."""
    other_s: float = 0.0
    """The rest of the step (Python, bookkeeping): constant per step."""
    batch: int
    """Per-rank batch of the measured run."""
    gradient_bytes: int
    """Bytes all-reduced per step (parameters x element size)."""

    def __post_init__(self) -> None:
        if min(self.data_s, self.compute_s, self.optimizer_s, self.other_s) < 0 or self.batch < 1:
            raise ConfigError("measured step times must be >= 0 and the batch >= 1",
                              hint="measure a single-rank run with --breakdown")

    @property
    def step_s(self) -> float:
        return self.data_s + self.compute_s + self.optimizer_s + self.other_s


@dataclass(frozen=True, kw_only=True)
class ModelOptions:
    """How the measured rank is extrapolated."""

    scaling: str = "weak"
    """strong: global batch fixed (per-rank batch = batch / n); weak: per-rank batch fixed."""
    overlap: float = 1.0
    """Fraction of backward time that can hide communication (DDP buckets overlap with backward)."""
    backward_fraction: float = 2 / 3
    """Share of forward+backward spent in backward (backward ~ 2x forward)."""
    bucket_bytes: int = 25 * MiB
    """DDP bucket_cap_mb (25 MiB default)."""
    buckets: int | None = None
    """Gradient buckets per step; None: gradient bytes / bucket_bytes, rounded up."""
    contention: float = 1.0
    """How many times longer a rank's host work takes for sharing hardware: ranks x the measured rank's
    compute units / the run's compute units (n ranks on the cores of one: n; one GPU per rank: 1)."""
    ranks_per_core: float = 1.0
    """Threads per core on the node (above 1 the ranks take turns on the cores)."""

    def __post_init__(self) -> None:
        if self.scaling not in ("strong", "weak"):
            raise ConfigError(f"scaling {self.scaling!r}", hint="strong or weak")
        if self.buckets is not None and self.buckets < 1:
            raise ConfigError(f"buckets {self.buckets}", hint="at least one gradient bucket")
        if not self.contention > 0 or self.ranks_per_core < 1:
            raise ConfigError(f"contention {self.contention}, ranks per core {self.ranks_per_core}",
                              hint="a positive factor (1: no sharing), and at least 1 rank per core")
        if not 0 <= self.overlap <= 1 or not 0 <= self.backward_fraction <= 1:
            raise ConfigError(f"overlap {self.overlap}, backward fraction {self.backward_fraction}",
                              hint="both are fractions between 0 and 1")


HOST_SECTIONS = ("data", "compute", "optimizer", "other")


@dataclass(frozen=True, kw_only=True)
class Calibration:
    """What measured multi-rank runs say the plain model misses (see the module docstring)."""

    sections: dict[str, float]
    """Per host section: measured time / the model's (geometric mean over the runs)."""
    comm: float = 1.0
    """In-training all-reduce time per step / the model's (ring with the measured bus bandwidth), from runs
    with a core per thread (where ranks take turns, the all-reduce also holds the wait for core-mates)."""
    overlap: float | None = None
    """Measured share of the hideable backward time that hid all-reduces; None: ModelOptions.overlap."""
    runs: tuple[str, ...] = ()
    """The configurations it was fitted on."""

    def __post_init__(self) -> None:
        bad = {k: v for k, v in self.sections.items() if k not in HOST_SECTIONS or not v > 0}
        if bad or not self.comm > 0 or (self.overlap is not None and not 0 <= self.overlap <= 1):
            raise ConfigError(f"calibration factors {self.sections}, comm {self.comm}, overlap {self.overlap}",
                              hint="factors are positive and the overlap a fraction")

    def factor(self, section: str) -> float:
        return self.sections.get(section, 1.0)


@dataclass(frozen=True)
class Prediction:
    ranks: int
    per_rank_batch: float
    global_batch: float
    data_s: float
    compute_s: float
    optimizer_s: float
    other_s: float
    comm_s: float
    exposed_comm_s: float
    step_s: float
    samples_per_s: float

    def as_dict(self) -> dict:
        from dataclasses import asdict

        return asdict(self)


def bucket_count(gradient_bytes: int, bucket_bytes: int = 25 * MiB) -> int:
    """DDP's buckets (torch 2.13 measured: one bucket while the gradients fit in ``bucket_cap_mb``)."""
    return math.ceil(gradient_bytes / bucket_bytes) if gradient_bytes > 0 else 0


def ring_allreduce_s(size_bytes: float, ranks: int, busbw_Bps: float, latency_s: float = 0.0, buckets: int = 1) -> float:
    """Time of a ring all-reduce of ``size_bytes`` split into ``buckets`` messages."""
    if ranks < 1:
        raise ConfigError(f"{ranks} ranks", hint="at least one rank")
    if ranks == 1 or size_bytes <= 0:
        return 0.0
    steps = 2 * (ranks - 1)
    return steps / ranks * size_bytes / busbw_Bps + buckets * steps * latency_s


def predict(measured: Measured, network: Network, ranks: int, options: ModelOptions = ModelOptions(),
            calibration: Calibration | None = None) -> Prediction:
    if ranks < 1:
        raise ConfigError(f"cannot predict {ranks} ranks", hint="use 1 or more ranks")
    if options.scaling == "strong":
        per_rank, global_batch = measured.batch / ranks, float(measured.batch)
    else:
        per_rank, global_batch = float(measured.batch), float(measured.batch * ranks)
    cal = calibration or Calibration(sections={})
    work = per_rank / measured.batch
    share = options.contention
    data = measured.data_s * work * share * cal.factor("data")
    compute = measured.compute_s * work * share * cal.factor("compute")
    optimizer = measured.optimizer_s * share * cal.factor("optimizer")
    other = measured.other_s * share * cal.factor("other")
    buckets = max(1, options.buckets or bucket_count(measured.gradient_bytes, options.bucket_bytes))
    comm = ring_allreduce_s(measured.gradient_bytes, ranks, network.busbw_Bps, network.latency_s, buckets) * cal.comm
    overlap = options.overlap if cal.overlap is None else cal.overlap
    exposed = max(0.0, comm - overlap * hideable_s(compute, measured.gradient_bytes, options))
    step = data + compute + optimizer + other + exposed
    return Prediction(ranks, per_rank, global_batch, data, compute, optimizer, other, comm, exposed, step,
                      global_batch / step)


def hideable_s(compute_s: float, gradient_bytes: int, options: ModelOptions = ModelOptions()) -> float:
    """Backward time all-reduces can hide behind: a bucket's all-reduce starts when its last gradient is
    ready, so the last bucket always runs after backward and only the other buckets' share can hide."""
    buckets = max(1, options.buckets or bucket_count(gradient_bytes, options.bucket_bytes))
    return options.backward_fraction * compute_s * (buckets - 1) / buckets


def projection_ranks(start: int, stop: int) -> list[int]:
    """Powers of two from ``start`` to ``stop`` (8, 16, ..., 1024)."""
    if start < 1 or stop < start:
        raise ConfigError(f"--project-to {stop} must be >= {start}", hint="e.g. --project-to 1024")
    out, n = [], 1
    while n <= stop:
        if n >= start:
            out.append(n)
        n *= 2
    if out[-1:] != [stop]:
        out.append(stop)
    return out


def project(measured: Measured, network: Network, ranks: list[int],
            options: ModelOptions = ModelOptions(), calibration: Calibration | None = None) -> list[Prediction]:
    usable = [n for n in ranks if network.max_ranks is None or n <= network.max_ranks]
    return [predict(measured, network, n, options, calibration) for n in usable]


def presets_table() -> str:
    """``trainscale bench --list-interconnects``: every preset with its numbers and where they come from."""
    lines = [f"{'preset':<14} {'busbw GB/s':>10} {'latency us':>10}  source"]
    for p in PRESETS.values():
        lines.append(f"{p.name:<14} {p.busbw_Bps / 1e9:>10.1f} {p.latency_us:>10.0f}  {p.link_gbit:g} Gb/s x "
                     f"{p.links_per_node} x {p.efficiency:.0%}: {p.source}")
    return "\n".join(lines)
