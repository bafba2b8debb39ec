"""Run the doctor in this process: ``python -m trainscale.doctor`` (alone, under `trainscale run`, under srun)."""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import socket
import sys
from collections.abc import Mapping
from pathlib import Path

from trainscale.doctor import facts
from trainscale.doctor.finding import NETWORK, Finding, ok
from trainscale.doctor.local import (
    collect_binding,
    collect_devices,
    collect_launch,
    collect_load,
    collect_threads,
    collect_versions,
    cpus_per_rank,
)
from trainscale.doctor.network import ALONE, GATHERED, run_network
from trainscale.doctor.render import Report, render, render_json
from trainscale.topology import current_affinity


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options shared by `trainscale doctor` and `python -m trainscale.doctor`."""
    parser.add_argument(
        "--network",
        action="store_true",
        help="from every rank: resolve the master address, probe its port, run a short all-reduce",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        metavar="N",
        help="DataLoader num_workers you plan per rank, checked against the CPUs per rank",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds to wait for the other ranks in --network (default 60)",
    )
    parser.add_argument(
        "--size-mib",
        type=float,
        default=4.0,
        metavar="MIB",
        help="size of the --network all-reduce tensor (default 4 MiB)",
    )


def _load() -> float | None:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def build_report(args: argparse.Namespace, environ: Mapping[str, str], command: str) -> tuple[Report, bool]:
    """Collect every section. Returns the report and whether this process should print it (rank 0 only)."""
    versions = facts.read_versions()
    devices = facts.read_devices(environ)
    affinity = current_affinity()
    host = socket.gethostname()
    findings: list[Finding] = collect_versions(versions) + collect_devices(devices, versions)
    launch_findings, env = collect_launch(environ)
    findings += launch_findings
    findings += collect_binding(env, devices.topology, affinity, environ)
    cpus, why = cpus_per_rank(env, devices.topology, affinity, environ)
    findings += collect_threads(environ, cpus, why, workers=args.workers, torch_threads=_torch_threads())
    # the load average is the whole machine's: held against all its cores, not this job's share of them
    findings += collect_load(_load(), os.cpu_count() or 1, int((env.local_world_size if env else 1) or 1))
    ranks = 1
    speaks = env is None or env.rank == 0
    if not args.network:
        findings.append(
            ok(
                NETWORK,
                "network",
                "not checked",
                "add --network (under a launcher) to probe the master "
                "address and port and run an all-reduce from every rank",
            )
        )
    else:
        numel = max(1, int(args.size_mib * 2**20 / 4))
        network, outcome = run_network(env, environ, host=host, affinity=affinity, timeout_s=args.timeout, numel=numel)
        findings += network
        if outcome == GATHERED:
            ranks = len({f.rank for f in network if f.rank is not None})
        elif outcome == ALONE:
            speaks = True  # no gather happened: every rank must show its own result
    created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    report = Report(host=host, created=created, command=command, findings=tuple(findings), ranks_reporting=ranks)
    return report, speaks


def _torch_threads() -> int | None:
    try:
        import torch  # noqa: PLC0415 (optional dependency)

        return torch.get_num_threads()
    except Exception:
        return None


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Exit 0 when nothing is an error, 1 otherwise (or 0 with --output: the report is the result)."""
    parser = argparse.ArgumentParser(prog="python -m trainscale.doctor", description=__doc__)
    add_options(parser)
    parser.add_argument("--output", type=Path, default=None, help=argparse.SUPPRESS)  # JSON for `doctor --nproc`
    args = parser.parse_args(argv)
    environ = os.environ if environ is None else environ
    command = "python -m trainscale.doctor " + shlex.join(sys.argv[1:] if argv is None else argv)
    report, speaks = build_report(args, environ, command.strip())
    if not speaks:
        return 0
    if args.output is not None:  # `trainscale doctor --nproc N` reads these files back and prints them
        rank = env_rank(environ)
        target = args.output if rank == 0 else args.output.with_name(f"{args.output.name}.rank{rank}")
        target.write_text(render_json(report))
        return 0
    sys.stdout.write(render_json(report) if args.json else render(report))
    sys.stdout.flush()
    return 1 if report.counts()["error"] else 0


def env_rank(environ: Mapping[str, str]) -> int:
    try:
        from trainscale.env import detect  # noqa: PLC0415 (optional dependency)

        return detect(environ).rank
    except Exception:  # an unreadable environment was already reported as an error finding
        return 0
