"""`trainscale bench` and `trainscale plan --tune` options in the one order of ``trainscale.config``
(docs/architecture.md):
StudySpec / TuneSpec defaults < --config FILE's [bench] / [tune] table < TRAINSCALE_BENCH_* / TRAINSCALE_TUNE_* <
the command line (argparse's namespace, None where an option was not given). What the command decides itself
(SCRIPT and its arguments, the GPUs it sees, the cores, the ``--slurm`` target) is no option."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from trainscale.bench.configs import int_tuple, with_nodes
from trainscale.bench.study import StudySpec
from trainscale.config import load_config_file, resolve
from trainscale.plan.tune import TuneSpec

RENAMED = {"sweep_batch": "sweep_batches", "out": "out_dir"}
"""Options whose command-line name is not their field's (``--sweep-batch``: ``sweep_batches``)."""


def _sources(
    cls: type, section: str, ns: Mapping[str, Any], fixed: Mapping[str, Any], environ: Mapping[str, str] | None
) -> dict[str, Any]:
    names = {f.name for f in dataclasses.fields(cls)} - set(fixed)
    return {
        "section": section,
        "fixed": fixed,
        "environ": environ,
        "config": load_config_file(ns["config"]) if ns.get("config") else None,  # only [section] is read
        "cli": {RENAMED.get(k, k): v for k, v in ns.items() if RENAMED.get(k, k) in names},
    }


def _target(target: str | None, rest) -> dict[str, Any]:
    """SCRIPT [ARGS...], or (no SCRIPT) the workload's arguments after ``--``."""
    return {
        "script": target,
        "script_args": tuple(rest) if target else (),
        "workload_args": () if target else tuple(rest),
    }


def study_spec(
    ns: Mapping[str, Any], *, target: str | None = None, rest=(), slurm=None, environ: Mapping[str, str] | None = None
) -> StudySpec:
    """The study of ``trainscale bench`` (``ns``: its parsed options; ``target``, ``rest``: SCRIPT and its
    arguments, or the workload's after ``--``; ``slurm``: the ``--slurm`` target)."""
    from trainscale.runtime.device import visible_gpu_count  # noqa: PLC0415 (torch-free module)

    nodes = int_tuple(ns.get("nodes"), "--nodes")
    # a login node's GPUs say nothing of the compute nodes'
    fixed = {**_target(target, rest), "slurm": slurm, "gpus_visible": 0 if slurm is not None else visible_gpu_count()}
    # with no SCRIPT the study is of the cnn workload unless a source names one
    spec, origin = resolve(
        StudySpec, defaults={} if target else {"workload": "cnn"}, **_sources(StudySpec, "bench", ns, fixed, environ)
    )
    if nodes:  # --nodes 1,2 adds 1n,2n to the configurations a source gave, or is the study's only ones
        spec = dataclasses.replace(spec, configs=with_nodes(spec.configs if "configs" in origin else None, nodes))
    return spec


def tune_spec(
    ns: Mapping[str, Any], *, target: str | None = None, rest=(), environ: Mapping[str, str] | None = None
) -> TuneSpec:
    """The search of ``trainscale plan --tune`` (``ns``: its parsed options; ``target``, ``rest``: as for a study)."""
    fixed = {**_target(target, rest), "cores": os.cpu_count() or 1}
    spec, _ = resolve(
        TuneSpec,
        defaults={"workload": None} if target else {},  # a SCRIPT is the target
        **_sources(TuneSpec, "tune", ns, fixed, environ),
    )
    return spec


__all__ = ["study_spec", "tune_spec"]
