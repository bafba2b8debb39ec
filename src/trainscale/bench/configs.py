"""Configuration tokens of a scaling study (``--configs cpu,1,2,4``, ``2x4``, ``2n``) and batch sizes per run.

Pure: parsing and planning only, so every mistake is reported before anything launches.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from trainscale.errors import ConfigError

TOKEN_FORMS = "cpu (1 process on CPU), N (N ranks on one node), NxM (N nodes x M ranks, SLURM), Nn (N nodes, SLURM)"
SCALINGS = ("strong", "weak")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One point of the study: how many ranks, where."""

    token: str
    """The token as the user wrote it (what ``--baseline`` refers to)."""
    nproc_per_node: int
    """Ranks on each node."""
    nnodes: int = 1
    """Nodes (more than one needs SLURM)."""
    device: str = "auto"
    """Device passed to the workload: cpu for the ``cpu`` token, otherwise auto (GPU when visible)."""
    gpus: bool = False
    """True when the ranks use GPUs (what this machine shows, or with --slurm the profile's GPUs per node)."""

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ConfigError(
                f"configuration {self.token!r} has {self.nproc_per_node} rank(s) on {self.nnodes} node(s)",
                hint="every configuration needs at least one rank on one node",
            )

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    @property
    def label(self) -> str:
        """The seed table's "Version" column."""
        if self.token == "cpu":
            return "CPU"
        unit = "GPU" if self.gpus else "CPU rank"
        plural = "s" if self.nproc_per_node > 1 else ""
        if self.nnodes > 1:
            return f"DDP {self.nnodes} nodes x {self.nproc_per_node} {unit}{plural}"
        if self.world_size == 1:
            return f"Single {unit}"
        return f"DDP {self.world_size} {unit}{plural}"


def _positive(token: str, text: str, what: str) -> int:
    value = int(text)
    if value < 1:
        raise ConfigError(
            f"configuration {token!r}: {value} {what}",
            hint=f"use at least 1 {what.rstrip('s')} — valid forms: {TOKEN_FORMS}",
        )
    return value


def parse_token(token: str, *, gpus_visible: int, slurm: bool = False, ranks_per_node: int | None = None) -> RunConfig:
    """One token -> RunConfig.

    ``gpus_visible``: GPUs on this node (with ``slurm``: GPUs per node of the profile, not checked against N).
    ``ranks_per_node``: what ``Nn`` means (from the SLURM profile).
    """
    text = token.strip().lower()
    if text == "cpu":
        return RunConfig(token="cpu", nproc_per_node=1, device="cpu")
    use_gpus = gpus_visible > 0
    if re.fullmatch(r"-?\d+", text):
        n = _positive(token, text, "ranks")
        if use_gpus and n > gpus_visible and not slurm:
            raise ConfigError(
                f"configuration {token!r} asks for {n} GPU ranks but {gpus_visible} GPU(s) are visible",
                hint=f"use at most {gpus_visible} ranks on this node, or run the study with --slurm",
            )
        return RunConfig(token=token, nproc_per_node=n, gpus=use_gpus)
    match = re.fullmatch(r"(-?\d+)x(-?\d+)", text) or re.fullmatch(r"(-?\d+)n", text)
    if match:
        nodes = _positive(token, match.group(1), "nodes")
        if match.re.pattern.endswith("n"):
            if ranks_per_node is None and slurm:
                raise ConfigError(
                    f"configuration {token!r} counts nodes, but the profile has no GPUs per node to "
                    "say how many ranks a node runs",
                    hint=f"give --gpus-per-node R (ranks per node), or write NxR, e.g. {nodes}x2",
                )
            if ranks_per_node is None:
                raise ConfigError(
                    f"configuration {token!r} counts nodes, which needs --slurm and a profile",
                    hint="run on one node with a plain number of ranks, e.g. --configs 1,2",
                )
            per_node = ranks_per_node
        else:
            per_node = _positive(token, match.group(2), "ranks per node")
        if nodes > 1 and not slurm:
            raise ConfigError(
                f"configuration {token!r} spans {nodes} nodes, which needs --slurm",
                hint="add --slurm --profile NAME, or use a single-node configuration such as 2 or 4",
            )
        return RunConfig(token=token, nproc_per_node=per_node, nnodes=nodes, gpus=use_gpus)
    raise ConfigError(
        f"unknown configuration token {token!r}", hint=f"valid forms: {TOKEN_FORMS}; e.g. --configs cpu,1,2,4"
    )


def parse_configs(
    text: str, *, gpus_visible: int, slurm: bool = False, ranks_per_node: int | None = None
) -> tuple[RunConfig, ...]:
    tokens = [t.strip() for t in str(text).split(",")]
    if not any(tokens):
        raise ConfigError("--configs is empty", hint=f"e.g. --configs cpu,1,2,4 (forms: {TOKEN_FORMS})")
    if "" in tokens:
        raise ConfigError(f"--configs {text!r} has an empty entry", hint="separate tokens with single commas: 1,2,4")
    configs = tuple(
        parse_token(t, gpus_visible=gpus_visible, slurm=slurm, ranks_per_node=ranks_per_node) for t in tokens
    )
    seen: set[str] = set()
    for c in configs:
        if c.token.lower() in seen:
            raise ConfigError(
                f"configuration {c.token!r} appears twice in --configs {text!r}", hint="list each configuration once"
            )
        seen.add(c.token.lower())
    return configs


def find_baseline(configs: tuple[RunConfig, ...], token: str | None) -> RunConfig:
    """The configuration speedups are measured against: ``--baseline`` or the first one."""
    if token is None:
        return configs[0]
    for c in configs:
        if c.token.lower() == token.strip().lower():
            return c
    raise ConfigError(
        f"--baseline {token!r} is not one of the study's configurations",
        hint="choose one of: " + ", ".join(c.token for c in configs),
    )


def per_rank_batch(config: RunConfig, batch_size: int, scaling: str) -> int:
    """Strong scaling: ``batch_size`` is global and split over ranks; weak: it is per rank."""
    if scaling not in SCALINGS:
        raise ConfigError(
            f"--scaling {scaling!r} unknown", hint="use strong (fixed global batch) or weak (fixed per-rank batch)"
        )
    if batch_size < 1:
        raise ConfigError(f"--batch-size {batch_size} must be >= 1", hint="e.g. --batch-size 64")
    if scaling == "weak":
        return batch_size
    if batch_size % config.world_size:
        raise ConfigError(
            f"strong scaling keeps the global batch {batch_size} fixed, but configuration "
            f"{config.token!r} has {config.world_size} ranks and {batch_size} is not divisible by "
            f"{config.world_size}",
            hint="choose a global --batch-size divisible by every configuration's rank count, or use --scaling weak",
        )
    return batch_size // config.world_size


def scaled_max_steps(max_steps: int | None, config: RunConfig, baseline: RunConfig, scaling: str) -> int | None:
    """Weak scaling processes ``ranks`` times more samples per step; keep the study's work equal."""
    if max_steps is None or scaling == "strong":
        return max_steps
    return max(1, -(-max_steps * baseline.world_size // config.world_size))


def with_nodes(configs: str | None, nodes: tuple[int, ...]) -> str:
    """``--configs`` plus one ``Nn`` configuration per ``--nodes`` entry (just those when --configs is not
    given). ``--configs ''`` stays empty, for parse_configs to refuse: not the default study."""
    tokens = [t.strip() for t in configs.split(",")] if configs is not None else []
    known = {t.lower() for t in tokens}
    tokens += [f"{n}n" for n in nodes if f"{n}n" not in known]
    return ",".join(tokens) if configs is not None or tokens else "1,2"


def int_tuple(value, option: str) -> tuple[int, ...]:
    """Numbers, each >= 1, as a command line or a variable spells them (``16,32``) or a TOML array (``[16, 32]``)."""
    if not value:
        return ()
    text = value if isinstance(value, str) else ",".join(str(v) for v in value)
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise ConfigError(
            f"{option} {text!r} is not a comma-separated list of numbers", hint=f"e.g. {option} 16,32,64,128"
        ) from None
    bad = [v for v in values if v < 1]
    if bad:
        raise ConfigError(f"{option} {text!r} contains {bad[0]}", hint="every value must be >= 1")
    return values
