"""The one place that changes this process's CPU affinity. Everything else in topology/ only reads and plans."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable


def current_affinity() -> frozenset[int]:
    """CPUs this process may run on now."""
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    try:  # platforms without sched_getaffinity; psutil knows a few more (Windows)
        import psutil  # noqa: PLC0415 (optional dependency)

        return frozenset(psutil.Process().cpu_affinity())
    except (ImportError, AttributeError, OSError):
        return frozenset(range(os.cpu_count() or 1))


def apply_cpu_binding(cpus: Iterable[int]) -> frozenset[int]:
    """Bind this process (and threads it starts later) to ``cpus``; return the affinity actually in force.

    The kernel refuses CPUs outside the job's cgroup/cpuset, so callers should pass a subset of
    :func:`current_affinity` and compare the result with what they asked for. Where the platform
    cannot bind (macOS) nothing changes and the current affinity comes back.
    """
    wanted = set(cpus)
    if not wanted:
        return current_affinity()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, wanted)
    else:
        with contextlib.suppress(ImportError, AttributeError, OSError):
            import psutil  # noqa: PLC0415 (job kit)

            psutil.Process().cpu_affinity(sorted(wanted))
    return current_affinity()


def far_from_gpu(actual: Iterable[int], gpu_cores: Iterable[int]) -> bool:
    """True when most of the cores a rank runs on are not close to its GPU (worth a warning); unknown
    GPU-local cores (empty) never count as far."""
    close, running = set(gpu_cores), set(actual)
    if not close or not running:
        return False
    return len(running & close) * 2 < len(running)
