"""Submit a function or a script from Python, and await it: ``trainscale.slurm`` (submitit's shape).

    job = trainscale.slurm.submit(train, 1e-3, profile="lumi", account="project_465000000", nodes=2,
                                  time="01:00:00")
    job.result()         # waits; rank 0's return value, or RankFailed with the failing rank's traceback

The options are ``trainscale slurm``'s by field name, resolved, linted and submitted by the same code as
``trainscale slurm --submit``; a function's call is pickled into the run directory and run on every rank
by launch/runner.py. The whole story: docs/ecosystem.md (``trainscale.slurm``).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import fields
from pathlib import Path
from typing import Any

from trainscale.config import load_config_file, resolve
from trainscale.errors import ConfigError, did_you_mean
from trainscale.launch.function import RUNNER
from trainscale.launch.runner import write_call
from trainscale.launch.slurm.future import Job
from trainscale.launch.slurm.job import refuse_errors, snapshot_findings, submit_job
from trainscale.launch.slurm.lint import WARNING, lint
from trainscale.launch.slurm.snapshot import installed, project_root
from trainscale.launch.slurm.spec import SlurmJobSpec
from trainscale.launch.slurm.spec import resolve as spec_plan
from trainscale.launch.slurm.sweep import array_range
from trainscale.profiles import load_profile

_TARGET = ("script", "module", "workload", "args", "command_line", "sweep", "array")
"""SlurmJobSpec fields the API sets itself."""


def _code_root(fn: Callable[..., Any]) -> Path | None:
    """The project a function's job snapshots: its module's, or the working directory's when it has no
    importable file (a notebook, ``__main__``); None outside a project or for installed packages."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    file = getattr(module, "__file__", None)
    if module is None or module.__name__ == "__main__" or not file:
        return project_root(Path.cwd())
    return None if installed(Path(file)) else project_root(Path(file).absolute().parent)


def build_spec(target: dict[str, Any], options: dict[str, Any], *, environ: dict[str, str] | None = None):
    """(spec, profile) from the target and the caller's options, in the one resolution order."""
    valid = tuple(f.name for f in fields(SlurmJobSpec) if f.name not in _TARGET) + ("config",)
    for key in options:
        if key not in valid:
            raise ConfigError(f"trainscale.slurm: unknown option {key!r}", hint=did_you_mean(key, valid))
    given = dict(options)
    config = load_config_file(given.pop("config")) if given.get("config") else None
    if "output_dir" in given:
        given["output_dir"] = Path(given["output_dir"])
    for key in ("modules", "setup", "container_setup", "binds", "extra_sbatch"):
        if isinstance(given.get(key), str):
            given[key] = (given[key],)
    try:
        spec, _ = resolve(
            SlurmJobSpec,
            section="slurm",
            config=config,
            environ=os.environ if environ is None else environ,
            cli={**given, **target},
        )
    except ConfigError as exc:
        if "time" in str(exc) and "missing" in str(exc):
            raise ConfigError(
                "trainscale.slurm: time= is required", hint='give the job\'s time limit, e.g. time="01:00:00"'
            ) from None
        raise
    return spec, load_profile(spec.profile)


def _function_target(fn: Callable[..., Any], options: dict[str, Any]) -> dict[str, Any]:
    target = {
        "module": RUNNER,
        "args": ("$TRAINSCALE_RUN_DIR",),
        "command_line": ("trainscale.slurm", f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)!s}"),
    }
    if "job_name" not in options:
        target["job_name"] = "trainscale-" + re.sub(r"[^A-Za-z0-9._-]", "_", getattr(fn, "__name__", "function"))
    if "snapshot" not in options:
        root = _code_root(fn)
        if root is not None:
            target["snapshot"] = str(root)
    return target


def _submit(spec, profile, write):
    """Lint (errors refuse, warnings are said), then the same submission as ``trainscale slurm --submit``,
    said on stderr."""
    plan = spec_plan(spec, profile)
    findings = lint(spec, profile, plan) + snapshot_findings(spec, plan)
    refuse_errors(findings, "trainscale.slurm: ")
    for finding in findings:
        if finding.level == WARNING:
            print(f"trainscale.slurm: {finding}", file=sys.stderr, flush=True)
    record = submit_job(spec, profile, plan, before_submit=write)
    what = f"array job {record.job_id} ({spec.array})" if spec.array else f"job {record.job_id}"
    print(
        f"trainscale.slurm: submitted {what}, world size {record.world_size}; run directory {record.run_dir}",
        file=sys.stderr,
        flush=True,
    )
    return record


def submit(fn: Callable[..., Any] | str | os.PathLike, /, *args: Any, **options: Any) -> Job:
    """Submit ``fn(*args)`` (or a script path with its arguments) as one SLURM job on ``options``' allocation;
    returns its :class:`Job`. Keyword arguments for ``fn``: ``functools.partial``."""
    script = isinstance(fn, (str, os.PathLike))
    target = (
        {
            "script": str(fn),
            "args": tuple(str(a) for a in args),
            "command_line": ("trainscale.slurm", str(fn), *map(str, args)),
        }
        if script
        else _function_target(fn, options)
    )
    spec, profile = build_spec(target, options)
    record = _submit(spec, profile, None if script else lambda plan: write_call(plan.run_dir, fn, args))
    return Job(record.job_id, Path(record.run_dir), record, function=not script)


def map_array(
    fn: Callable[..., Any], /, *iterables: Iterable[Any], max_parallel: int | None = None, **options: Any
) -> list[Job]:
    """``fn(a, b, ...)`` for each element of zip(*iterables), as one SLURM array job (element i in the run's
    ``task-<i>/``); a :class:`Job` per element, in order. ``max_parallel``: elements running at once."""
    calls = list(zip(*iterables))
    if not calls:
        raise ConfigError(
            "trainscale.slurm.map_array: no parameters to map over",
            hint="pass one list per argument of the function, e.g. map_array(train, [1e-3, 3e-4], ...)",
        )

    array = array_range(len(calls), max_parallel, option="max_parallel=")
    spec, profile = build_spec({**_function_target(fn, options), "array": array, "sweep": True}, options)

    def write(plan) -> None:
        (plan.run_dir / "tasks").mkdir(exist_ok=True)
        for i, call in enumerate(calls):
            (plan.run_dir / "tasks" / f"{i}.args").write_text("")  # the array task adds no arguments
            write_call(plan.run_dir / f"task-{i}", fn, call)

    record = _submit(spec, profile, write)
    return [Job(f"{record.job_id}_{i}", Path(record.run_dir) / f"task-{i}", record) for i in range(len(calls))]


class Executor:
    """submitit's executor shape: the options once, then ``submit`` and ``map_array``."""

    def __init__(self, **options: Any) -> None:
        self.options = dict(options)

    def update_parameters(self, **options: Any) -> None:
        self.options.update(options)

    def submit(self, fn: Callable[..., Any] | str, /, *args: Any) -> Job:
        return submit(fn, *args, **self.options)

    def map_array(self, fn: Callable[..., Any], /, *iterables: Iterable[Any]) -> list[Job]:
        return map_array(fn, *iterables, **self.options)
