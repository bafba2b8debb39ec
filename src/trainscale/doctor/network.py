"""``--network``: from every rank, resolve the master address, probe its port, run a short all-reduce,
then gather every rank's findings on rank 0."""

from __future__ import annotations

import os
import socket
import statistics
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import trainscale
from trainscale.doctor.finding import NETWORK, Finding, at_level, error, ok, warning
from trainscale.env import LaunchEnv
from trainscale.topology import format_cpulist

GATHERED, SENT, ALONE = "gathered", "sent", "alone"

SINGLE_HINT = (
    "run it on the ranks of a job: `trainscale doctor --nproc 2 --network`, "
    "`trainscale run --nproc-per-node 2 -m trainscale.doctor --network`, "
    "or inside an allocation `srun python -m trainscale.doctor --network`"
)


def _tag(findings: list[Finding], rank: int) -> list[Finding]:
    return [replace(f, rank=rank) for f in findings]


def check_resolution(host: str, port: int) -> tuple[Finding, str | None]:
    """Does the master address resolve? Returns the finding and the first address (None when it does not)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        return error(
            NETWORK,
            "master address",
            f"{host!r} (MASTER_ADDR, port {port}) does not resolve: {reason}",
            "set MASTER_ADDR to a host name every node can resolve (the first node of the allocation) or "
            "an IP address; check /etc/hosts and DNS on this node",
            host=host,
            port=port,
        ), None
    addresses = sorted({info[4][0] for info in infos})
    return ok(
        NETWORK,
        "master address",
        f"{host} resolves to {', '.join(addresses)}",
        host=host,
        port=port,
        addresses=addresses,
    ), addresses[0]


def check_port_listening(host: str, address: str, port: int, *, wait_s: float) -> Finding:
    """Connect to the store's port, retrying for ``wait_s`` (rank 0 may still be starting it)."""
    deadline = time.monotonic() + wait_s
    attempts = 0
    while True:
        attempts += 1
        started = time.perf_counter()
        try:
            with socket.create_connection((address, port), timeout=min(5.0, max(0.5, wait_s))):
                ms = (time.perf_counter() - started) * 1000
            return ok(
                NETWORK,
                "master port",
                f"TCP connect to {host}:{port} ({address}) in {ms:.2f} ms",
                host=host,
                port=port,
                connect_ms=round(ms, 3),
                attempts=attempts,
            )
        except OSError as exc:
            if time.monotonic() >= deadline:
                reason = exc.strerror or type(exc).__name__
                return error(
                    NETWORK,
                    "master port",
                    f"cannot connect to {host}:{port} ({address}) after {attempts} "
                    f"attempt(s) over {wait_s:.0f}s: {reason}",
                    "nothing listens there, or a firewall blocks it: check that rank 0 runs on that host, "
                    "that MASTER_PORT is the same on every node, and that the port is open between nodes",
                    host=host,
                    port=port,
                )
            time.sleep(0.2)  # a retry interval, not synchronisation: the loop ends on success or the deadline


def check_port_free(host: str, address: str, port: int) -> Finding:
    """Rank 0 of an srun/MPI job starts the store itself: its port must be free before it does."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, port))
        except OSError as exc:
            return error(
                NETWORK,
                "master port",
                f"rank 0 must listen on {host}:{port} ({address}) but cannot: {exc.strerror}",
                "another job or process holds the port (or the address is not this "
                "node's): choose another MASTER_PORT, or let `trainscale slurm` pick a free one",
                host=host,
                port=port,
            )
    return ok(NETWORK, "master port", f"{host}:{port} is free for rank 0's store", host=host, port=port)


def all_reduce_check(runtime, numel: int, repeats: int = 5) -> Finding:
    """All-reduce (rank+1) over every rank; the sum must be n(n+1)/2. Reports the median time and bus bandwidth."""
    import torch  # noqa: PLC0415 (CLI start-up)
    import torch.distributed as dist  # noqa: PLC0415 (CLI start-up)

    n = runtime.world_size
    tensor = torch.full((numel,), float(runtime.rank + 1), dtype=torch.float32, device=runtime.device)
    expected = n * (n + 1) / 2

    dist.all_reduce(tensor)
    runtime.synchronize()
    got = float(tensor[0].item()), float(tensor[-1].item())
    if got != (expected, expected):
        return error(
            NETWORK,
            "all-reduce",
            f"all-reduce of {n} ranks gave {got[0]} (first) / {got[1]} (last), expected {expected}",
            "the backend returns wrong results: report it with this output; try "
            "NCCL_P2P_DISABLE=1 / NCCL_IB_DISABLE=1 to find the transport at fault",
            got=list(got),
        )
    times = []
    for _ in range(repeats):
        runtime.synchronize()
        started = time.perf_counter()
        dist.all_reduce(tensor)
        runtime.synchronize()
        times.append(time.perf_counter() - started)
    median = statistics.median(times)
    size = numel * 4
    busbw = size / median * 2 * (n - 1) / n / 1e9 if median > 0 else 0.0
    return ok(
        NETWORK,
        "all-reduce",
        f"{runtime.backend} on {runtime.device}: sum over {n} ranks correct "
        f"({expected:g}); {size / 2**20:.1f} MiB in {median * 1000:.2f} ms median of {repeats}, "
        f"bus bandwidth {busbw:.2f} GB/s",
        backend=runtime.backend,
        device=str(runtime.device),
        bytes=size,
        median_ms=round(median * 1000, 3),
        busbw_gbs=round(busbw, 3),
        expected=expected,
    )


def transport_check(runtime, env: LaunchEnv, environ: Mapping[str, str], nccl_log) -> Finding:
    """Which network the collective library used, against what the cluster's profile expects
    (``TRAINSCALE_INTERCONNECT``, exported by the batch script): sockets on a fast network is the finding."""
    from trainscale.observe import interconnect  # noqa: PLC0415 (CLI start-up)

    expected = environ.get(interconnect.EXPECTED_VAR, "")
    required = environ.get(interconnect.REQUIRED_VAR) == "1"
    backend = "gloo" if runtime.backend == "gloo" else "nccl"
    if backend == "nccl" and nccl_log is None:
        return ok(
            NETWORK,
            "transport",
            "NCCL_DEBUG is set by you: trainscale did not read NCCL's log",
            "unset NCCL_DEBUG to let `trainscale doctor --network` read which network NCCL chose",
        )
    verdict = (
        interconnect.check_file(nccl_log, expected=expected, multi_node=env.num_nodes > 1, required=required)
        if backend == "nccl"
        else interconnect.judge(
            interconnect.Transport((), False, ()), expected=expected, multi_node=env.num_nodes > 1, backend="gloo"
        )
    )
    return at_level(verdict.level)(NETWORK, "transport", verdict.message, verdict.hint, expected=expected)


def check_overlap(findings: list[Finding]) -> list[Finding]:
    """From every rank's identity: ranks on one host whose CPU sets overlap compete for cores."""
    by_host: dict[str, list[tuple[int, set[int]]]] = {}
    for f in findings:
        if f.check == "host" and f.rank is not None:
            # Keyed by node rank too: emulated clusters (and containers) give several nodes one host name.
            where = f"{f.detail['host']} (node {f.detail.get('node', 0)})"
            by_host.setdefault(where, []).append((f.rank, set(f.detail["cpus"])))
    clashes = []
    for host, ranks in sorted(by_host.items()):
        for i, (a, cpus_a) in enumerate(ranks):
            for b, cpus_b in ranks[i + 1 :]:
                if cpus_a & cpus_b:
                    clashes.append(f"ranks {a} and {b} on {host} share CPUs {format_cpulist(sorted(cpus_a & cpus_b))}")
    if not clashes:
        return [ok(NETWORK, "CPU sets", "no two ranks on one host share CPUs" if by_host else "no rank reported")]
    return [
        warning(
            NETWORK,
            "CPU sets",
            "; ".join(clashes),
            "unbound ranks compete for cores (each OMP pool spans "
            "all of them): bind them with TRAINSCALE_CPU_BIND=topology or srun --cpu-bind",
        )
    ]


def run_network(
    env: LaunchEnv | None,
    environ: Mapping[str, str],
    *,
    host: str,
    affinity: frozenset[int],
    timeout_s: float = 60.0,
    numel: int = 1 << 20,
) -> tuple[list[Finding], str]:
    """Every rank runs this. Returns (findings, outcome): outcome ``gathered`` on rank 0 with every rank's
    findings, ``sent`` on the other ranks (rank 0 reports theirs), ``alone`` when no gather was possible
    (single process, or a check failed before the process group was up): this rank must report its own."""
    if env is None:
        return [
            error(
                NETWORK,
                "network",
                "the launch environment could not be read, so there is nothing to probe",
                "fix the launch environment error above first",
            )
        ], ALONE
    if not env.is_distributed:
        return [
            ok(NETWORK, "network", "single process: no master address, port or other rank to probe", SINGLE_HINT)
        ], ALONE
    master, port = env.master_addr or "", env.master_port or 0  # LaunchEnv guarantees both when distributed
    resolved, address = check_resolution(master, port)
    mine = [resolved]
    if address is None:
        return _tag(mine, env.rank), ALONE
    # torchrun's workers reach the agent's store, which is up before they start; otherwise (srun/MPI tasks,
    # or RANK/MASTER_* exported by hand) rank 0 creates the store in init_process_group.
    if not env.agent_store and env.rank == 0:
        mine.append(check_port_free(master, address, port))
    else:
        mine.append(check_port_listening(master, address, port, wait_s=min(timeout_s, 30.0)))
    if mine[-1].level == "error":
        return _tag(mine, env.rank), ALONE
    return _collective(env, environ, mine, host=host, affinity=affinity, timeout_s=timeout_s, numel=numel)


def _collective(
    env: LaunchEnv,
    environ: Mapping[str, str],
    mine: list[Finding],
    *,
    host: str,
    affinity: frozenset[int],
    timeout_s: float,
    numel: int,
) -> tuple[list[Finding], str]:
    import tempfile  # noqa: PLC0415 (CLI start-up)

    import torch.distributed as dist  # noqa: PLC0415 (CLI start-up)

    from trainscale.observe import interconnect  # noqa: PLC0415 (CLI start-up)

    # NCCL says which network it picked only in its INFO log: send that to a file of this rank, read it below.
    nccl_log = interconnect.arm(os.environ, Path(env.job_dir or tempfile.gettempdir()) / "nccl-debug")
    try:
        runtime = trainscale.init(timeout_s=timeout_s, set_threads=False, environ=dict(environ))
    except Exception as exc:
        mine.append(
            error(
                NETWORK,
                "process group",
                f"init_process_group failed: {type(exc).__name__}: {exc}",
                f"every rank must reach {env.master_addr}:{env.master_port} within {timeout_s:.0f}s; "
                "check that all ranks started and use the same MASTER_ADDR/MASTER_PORT",
            )
        )
        return _tag(mine, env.rank), ALONE
    with runtime:
        mine.insert(
            0,
            ok(
                NETWORK,
                "host",
                f"{host}, local rank {env.local_rank}, node {env.node_rank}, device "
                f"{runtime.device}, CPUs {format_cpulist(sorted(affinity))}",
                host=host,
                node=env.node_rank,
                local_rank=env.local_rank,
                cpus=sorted(affinity),
            ),
        )  # what check_overlap compares
        try:
            mine.append(all_reduce_check(runtime, numel))
        except Exception as exc:
            mine.append(
                error(
                    NETWORK,
                    "all-reduce",
                    f"all-reduce failed: {type(exc).__name__}: {exc}",
                    "a rank stopped or the network between nodes dropped; rerun with NCCL_DEBUG=INFO "
                    "(GPU) or check GLOO_SOCKET_IFNAME names an interface every node has",
                )
            )
            return _tag(mine, env.rank), ALONE
        mine.append(transport_check(runtime, env, environ, nccl_log))
        mine = _tag(mine, env.rank)
        gathered: list | None = [None] * env.world_size if env.rank == 0 else None
        dist.gather_object(mine, gathered, dst=0)
    if env.rank != 0:
        return mine, SENT
    every = [f for per_rank in gathered or [] for f in per_rank]
    return every + check_overlap(every), GATHERED
