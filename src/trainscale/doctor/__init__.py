"""`trainscale doctor`: one paste-able report of versions, devices, launch, binding, threads and network.

``collect_*`` functions are pure (facts in, Findings out); facts.py reads the system; network.py probes
the master address/port and runs an all-reduce on every rank; render.py formats; main.py wires it up.
"""

from trainscale.doctor.facts import Devices, Versions, read_devices, read_versions
from trainscale.doctor.finding import LEVELS, SECTIONS, Finding
from trainscale.doctor.local import (
    collect_binding,
    collect_devices,
    collect_launch,
    collect_threads,
    collect_versions,
    cpus_per_rank,
)
from trainscale.doctor.network import check_port_free, check_port_listening, check_resolution, run_network
from trainscale.doctor.render import Report, render, render_json

__all__ = [
    "LEVELS",
    "SECTIONS",
    "Devices",
    "Finding",
    "Report",
    "Versions",
    "check_port_free",
    "check_port_listening",
    "check_resolution",
    "collect_binding",
    "collect_devices",
    "collect_launch",
    "collect_threads",
    "collect_versions",
    "cpus_per_rank",
    "read_devices",
    "read_versions",
    "render",
    "render_json",
    "run_network",
]
