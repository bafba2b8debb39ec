"""From what the user gave (the command line's values, a --config file, the environment) to a checked job.

``trainscale slurm`` and ``trainscale sweep`` parse their options into a dict of :class:`SlurmJobSpec`
field values; everything after that (the option forms sbatch knows, the resolution order, the findings
that decide whether the job may be submitted) lives here, so the CLI only parses and prints.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path

from trainscale.errors import ConfigError, MissingOption
from trainscale.launch.slurm.spec import JobPlan, SlurmJobSpec, resolve
from trainscale.profiles.schema import ClusterProfile

_LISTS = ("modules", "setup", "container_setup", "binds", "extra_sbatch")


def spec_values(given: dict) -> dict:
    """The command line's option values as SlurmJobSpec fields: ``--gpus-per-node TYPE:N``, ``--env KEY=VALUE``
    (``--hang-timeout S`` among them) and the repeatable options' lists."""
    values = dict(given)
    if isinstance(values.get("nodes"), str):  # N, or sbatch's MIN-MAX
        text = values.pop("nodes")
        low, sep, high = text.partition("-")
        if not (low.isdigit() and (high.isdigit() or not sep)):
            raise ConfigError(
                f"--nodes {text!r} is not N or MIN-MAX",
                hint="e.g. --nodes 4, or --nodes 2-4 (start on 4, continue on as few as 2)",
            )
        values["nodes"] = int(high or low)
        if sep:
            values["min_nodes"] = int(low)
    if "gpus_per_node" in values:
        text = str(values.pop("gpus_per_node"))
        kind, _, count = text.rpartition(":")
        if not count.isdigit():
            raise ConfigError(f"--gpus-per-node {text!r} is not N or TYPE:N", hint="e.g. --gpus-per-node 4 or a100:4")
        values["gpus_per_node"] = int(count)
        if kind:
            values["gpu_type"] = kind
    if "env" in values:
        env = {}
        for item in values["env"]:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise ConfigError(f"--env {item!r} is not KEY=VALUE", hint="e.g. --env NCCL_DEBUG=INFO")
            env[key] = value
        values["env"] = env
    if "hang_timeout" in values:  # the workers' hang watch reads it (runtime/hangwatch/heartbeat.py)
        seconds = values.pop("hang_timeout")
        if not 0 <= seconds < float("inf"):
            raise ConfigError(
                f"--hang-timeout {seconds:g} must be 0 (never) or more seconds", hint="e.g. --hang-timeout 600"
            )
        values["env"] = {**values.get("env", {}), "TRAINSCALE_HANG_TIMEOUT": f"{seconds:g}"}
    values.update({key: tuple(values[key]) for key in _LISTS if key in values})
    if "output_dir" in values:
        values["output_dir"] = Path(values["output_dir"])
    return values


def job_spec(cli: dict, *, config_file: str | None, environ: Mapping[str, str] | None):
    """(spec, profile): defaults < profile < ``config_file``'s [slurm] table < TRAINSCALE_SLURM_* < ``cli``."""
    from trainscale.config import load_config_file  # noqa: PLC0415 (CLI start-up)
    from trainscale.config import resolve as resolve_sources  # noqa: PLC0415 (CLI start-up)
    from trainscale.profiles import load_profile  # noqa: PLC0415 (CLI start-up)

    config = load_config_file(config_file) if config_file else None
    try:
        spec, _ = resolve_sources(SlurmJobSpec, section="slurm", config=config, environ=environ, cli=cli)
    except MissingOption as exc:
        if exc.option != "time":
            raise
        raise ConfigError(
            "--time is required",
            hint='give the job\'s time limit, e.g. -t 01:00:00 (or time = "01:00:00" in the [slurm] table)',
        ) from None
    profile = load_profile(spec.profile)  # named in the one order, as any option (the environment beats the file)
    if spec.profile != profile.name:
        spec = dataclasses.replace(spec, profile=profile.name)
    return spec, profile


def check(
    spec: SlurmJobSpec, profile: ClusterProfile, *, preflight: Callable | None = None
) -> tuple[JobPlan, list, bool]:
    """(plan, findings, whether this machine's scheduler is the job's cluster): lint, the partition's real sizes,
    the code snapshot and the job's Python, errors first."""
    from trainscale.launch.slurm import cluster  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.slurm.job import snapshot_findings  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.slurm.lint import lint  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.slurm.probe import probe_python  # noqa: PLC0415 (CLI start-up)

    plan = resolve(spec, profile)
    sized, here = cluster.findings(plan, profile, cluster.partitions())
    findings = (
        lint(spec, profile, plan, preflight=preflight)
        + sized
        + snapshot_findings(spec, plan)
        + probe_python(spec, profile, plan)
    )
    findings.sort(key=lambda f: ("error", "warning", "note").index(f.level))
    return plan, findings, here
