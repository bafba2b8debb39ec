"""A study's runs as SLURM jobs (``trainscale bench --slurm``), each rendered, linted and submitted exactly as
``trainscale slurm --submit`` does it, then watched to its end: docs/scaling.md, "On SLURM"."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from trainscale.errors import ConfigError
from trainscale.launch.slurm.job import checked_plan
from trainscale.launch.slurm.spec import SlurmJobSpec, parse_time
from trainscale.profiles import load_profile


@dataclass(frozen=True, kw_only=True)
class SlurmTarget:
    """Where and how the study's jobs run: ``--slurm --profile P --time T ...``."""

    profile: str
    """Cluster profile name or .toml path (``trainscale profiles``)."""
    time: str
    """Time limit of each job, e.g. 00:20:00."""
    ranks_per_node: int | None = None
    """GPUs (CPU profiles: ranks) per node for ``Nn`` configurations; default: the profile's GPUs per node."""
    account: str | None = None
    partition: str | None = None
    reservation: str | None = None
    launcher: str | None = None
    """torchrun or srun; default: the profile's."""
    python: str | None = None
    """Python on the compute nodes; default: this one (outside containers)."""
    poll_s: float = 2.0
    """Seconds between queue polls while a job runs."""

    def __post_init__(self) -> None:
        parse_time(self.time)
        if self.ranks_per_node is not None and self.ranks_per_node < 1:
            raise ConfigError(
                f"--gpus-per-node {self.ranks_per_node} must be >= 1",
                hint="give the GPUs (CPU profiles: ranks) per node that `Nn` configurations use",
            )
        if self.poll_s <= 0:
            raise ConfigError(f"--poll {self.poll_s} must be positive", hint="e.g. --poll 2")
        self.cluster  # noqa: B018  an unknown profile is reported now, before anything runs

    @functools.cached_property
    def cluster(self):
        return load_profile(self.profile)

    @property
    def nodes_ranks(self) -> int | None:
        """What ``Nn`` means: ranks on each node."""
        return self.ranks_per_node or self.cluster.gpus_per_node or None

    def job(
        self,
        *,
        name: str,
        nodes: int,
        ranks_per_node: int,
        output_dir: Path,
        workload: str | None = None,
        module: str | None = None,
        script: str | None = None,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        command_line: tuple[str, ...] = (),
    ) -> SlurmJobSpec:
        return SlurmJobSpec(
            workload=workload,
            module=module,
            script=script,
            args=tuple(args),
            profile=self.profile,
            nodes=nodes,
            gpus_per_node=ranks_per_node,
            time=self.time,
            account=self.account,
            partition=self.partition,
            reservation=self.reservation,
            launcher=self.launcher,
            job_name=name,
            output_dir=output_dir,
            env=dict(env or {}),
            python=self.python,
            command_line=command_line,
        )


SLURM_ONLY = ("profile", "gpus_per_node", "time", "account", "partition", "reservation", "launcher", "python", "poll")
"""``trainscale bench``'s options of ``--slurm`` besides ``--nodes``, in the order a refusal names them."""


_EXAMPLE = (
    "--slurm --profile lumi --account project_465000000 --time 00:30:00 (`trainscale profiles` lists the profiles)"
)


def target_from_options(
    *,
    slurm: bool,
    options: dict,
    nodes=None,
    poll: float | None = None,
    unused: str = "only apply to SLURM jobs",
    here: str = "run on this node",
    example: str = _EXAMPLE,
) -> SlurmTarget | None:
    """The SlurmTarget of ``--slurm ...`` (``options``: the SLURM options' values by field name, None when not
    given; gpus_per_node and poll as the command spells them), or None; SLURM options without --slurm are refused
    (``unused``, ``here``: how the command says so; ``example``: a whole --slurm line). ``poll``: seconds between
    queue polls when ``options`` has none."""
    given = [f"--{name.replace('_', '-')}" for name, value in options.items() if value is not None]
    if not slurm:
        if given or nodes is not None:
            raise ConfigError(
                f"{', '.join(given or ['--nodes'])} {unused}",
                hint=f"add --slurm --profile NAME --time HH:MM:SS, or drop them to {here}",
            )
        return None
    if not options.get("profile") or not options.get("time"):
        raise ConfigError("--slurm needs --profile and --time", hint=f"e.g. {example}")
    keep = {k: options.get(k) for k in ("profile", "time", "account", "partition", "reservation", "launcher", "python")}
    poll = options.get("poll", poll)
    return SlurmTarget(**keep, ranks_per_node=options.get("gpus_per_node"), poll_s=2.0 if poll is None else poll)


@dataclass(frozen=True)
class PreparedJob:
    spec: SlurmJobSpec
    plan: object
    """The resolved JobPlan."""


def prepare(target: SlurmTarget, specs: dict[str, SlurmJobSpec]) -> dict[str, PreparedJob]:
    """Resolve and lint every job; the first error stops the study before anything is submitted."""
    return {
        name: PreparedJob(spec, checked_plan(spec, target.cluster, what=f"run {name}: "))
        for name, spec in specs.items()
    }
