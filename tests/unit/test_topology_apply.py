"""Applying a CPU set in this process, and a worker binding itself from TRAINSCALE_CPU_BIND."""

from __future__ import annotations

import os

import pytest

from trainscale.topology import (
    PLAN_ENV,
    Topology,
    apply_cpu_binding,
    bind_worker,
    current_affinity,
    far_from_gpu,
    format_cpulist,
)
from trainscale.topology.model import GpuInfo

needs_affinity = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no sched_setaffinity here")


@pytest.fixture
def restore_affinity():
    before = current_affinity()
    yield before
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, before)


def test_far_from_gpu():
    assert far_from_gpu({0, 1, 2, 3}, {8, 9, 10, 11})
    assert far_from_gpu({0, 1, 2, 8}, {8, 9})  # 1 of 4 close: mostly far
    assert not far_from_gpu({8, 9}, {8, 9, 10, 11})
    assert not far_from_gpu({0, 8}, {8})  # half close is not "far"
    assert not far_from_gpu({0, 1}, ())  # unknown GPU cores: no warning


@needs_affinity
def test_apply_cpu_binding_changes_and_reports(restore_affinity):
    first = min(restore_affinity)
    assert apply_cpu_binding([first]) == frozenset({first})
    assert current_affinity() == frozenset({first})
    assert apply_cpu_binding([]) == frozenset({first})  # empty request changes nothing


@needs_affinity
def test_bind_worker_applies_plan_from_env(restore_affinity):
    allowed = sorted(restore_affinity)
    first = allowed[0]
    plan = "/".join(f"-:{c}" for c in allowed)  # one CPU-only rank per allowed CPU
    report = bind_worker(0, len(allowed), environ={PLAN_ENV: plan})
    assert report.actual == (first,) and report.requested == (first,)
    assert report.applied == (len(allowed) > 1) and not report.far
    assert current_affinity() == frozenset({first})
    assert f"CPUs {first}" in report.describe()


@needs_affinity
def test_bind_worker_never_binds_outside_the_allowed_cpus(restore_affinity):
    outside = max(restore_affinity) + 1000
    report = bind_worker(0, 1, environ={PLAN_ENV: f"0:{outside}"})
    assert not report.applied and current_affinity() == restore_affinity
    assert "outside this process's allowed CPUs" in report.note
    assert report.far  # running on cores that are not the GPU's: warned
    assert "WARNING" in report.describe()


def test_bind_worker_without_plan_changes_nothing(restore_affinity):
    for environ in ({}, {PLAN_ENV: "none"}):
        report = bind_worker(0, 2, environ=environ)
        assert not report.applied and report.requested == () and current_affinity() == restore_affinity


def test_bind_worker_reports_bad_plans_instead_of_failing(restore_affinity):
    report = bind_worker(0, 4, environ={PLAN_ENV: "0:1-7/1:9-15"})
    assert not report.applied and "plans 2 local ranks but this node runs 4" in report.note
    report = bind_worker(0, 1, environ={PLAN_ENV: "garbage"})
    assert not report.applied and report.note.startswith("not bound: cannot read binding plan")
    assert current_affinity() == restore_affinity


@needs_affinity
def test_bind_worker_topology_mode_uses_detected_gpus(restore_affinity):
    allowed = tuple(sorted(restore_affinity))
    fake = Topology(gpus=(GpuInfo(index=0, vendor="nvidia", cpus=allowed[-1:]),), cpus=allowed)
    report = bind_worker(0, 1, environ={PLAN_ENV: "topology"}, detect=lambda: fake)
    assert report.gpu == 0 and report.actual == allowed[-1:]
    assert format_cpulist(report.actual) in report.describe()
