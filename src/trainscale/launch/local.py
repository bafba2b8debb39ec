"""Launch N workers on this node (and join other nodes) through torch.distributed.run's Python API.

Plan, then do: :class:`LocalLaunchSpec` is validated at construction (before any process starts);
:func:`launch` hands it to ``torch.distributed.launcher.api.elastic_launch``.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from trainscale.errors import ConfigError, LaunchError
from trainscale.launch.ports import check_port_free, free_port, parse_endpoint, resolve

NPROC_WORDS = ("auto", "gpu", "cpu")


def resolve_nproc(value: str | int, gpus: int | None = None) -> int:
    """``--nproc-per-node``: a number, ``gpu`` (one per visible GPU), ``auto`` (GPUs, else 1) or ``cpu`` (1)."""
    text = str(value).strip().lower()
    if text in NPROC_WORDS:
        if gpus is None:
            import torch

            gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if text == "gpu":
            if gpus == 0:
                raise ConfigError("--nproc-per-node gpu but no GPU is visible",
                                  hint="give a number of CPU processes, e.g. --nproc-per-node 2")
            return gpus
        return gpus if (text == "auto" and gpus) else 1
    try:
        n = int(text)
    except ValueError:
        raise ConfigError(f"--nproc-per-node {value!r} is not a number",
                          hint="use a positive integer, or one of: auto, gpu, cpu") from None
    if n < 1:
        raise ConfigError(f"--nproc-per-node {n}: at least one process per node is needed",
                          hint="use --nproc-per-node 1 or more (or 'gpu' for one per GPU)")
    return n


def parse_nnodes(value: str | int) -> tuple[int, int]:
    text = str(value)
    lo, _, hi = text.partition(":")
    try:
        low, high = int(lo), int(hi or lo)
    except ValueError:
        raise ConfigError(f"--nnodes {value!r} is not N or MIN:MAX", hint="e.g. --nnodes 2 or --nnodes 1:4") from None
    if low < 1 or high < low:
        raise ConfigError(f"--nnodes {value!r}: need 1 <= MIN <= MAX", hint="e.g. --nnodes 2")
    return low, high


@dataclass(frozen=True, kw_only=True)
class LocalLaunchSpec:
    """One launch of the elastic agent on this node."""

    target: str
    """Path of the training script, or a module name with ``module=True``."""
    args: tuple[str, ...] = ()
    """Arguments passed to the script."""
    module: bool = False
    """Run ``target`` as ``python -m target``."""
    nproc_per_node: int = 1
    """Workers on this node (already resolved from auto/gpu)."""
    nnodes: str = "1"
    """Nodes: N or MIN:MAX (elastic)."""
    node_rank: int | None = None
    """This node's rank with a static rendezvous; None lets the c10d rendezvous assign it."""
    rdzv_endpoint: str = ""
    """HOST:PORT of the rendezvous store; empty means this node alone on a free local port."""
    rdzv_backend: str = "c10d"
    """c10d (the store runs in the agent on the endpoint's host) or static."""
    rdzv_id: str = ""
    """Job id shared by all nodes of one job; a fresh one per launch when empty (jobs never mix)."""
    rdzv_timeout_s: int = 900
    """How long to wait for all nodes to arrive."""
    max_restarts: int = 0
    """Restarts of the whole worker group after a failure."""
    log_dir: Path | None = None
    """Where each rank's stdout/stderr go; a new directory per run under it."""
    console_all_ranks: bool = False
    """Show every rank's output on the console (prefixed); default: rank 0 only."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the workers."""

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1:
            raise ConfigError(f"nproc_per_node={self.nproc_per_node}", hint="use 1 or more")
        parse_nnodes(self.nnodes)
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts {self.max_restarts} is negative", hint="use 0 (fail fast) or more")
        if self.rdzv_backend not in ("c10d", "static"):
            raise ConfigError(f"--rdzv-backend {self.rdzv_backend!r} unknown", hint="use c10d or static")
        if self.module:
            import importlib.util

            try:
                found = importlib.util.find_spec(self.target)
            except (ImportError, ValueError):
                found = None
            if found is None:
                raise ConfigError(f"module {self.target!r} cannot be found", hint="check the name and that it is installed")
        elif not Path(self.target).is_file():
            raise ConfigError(f"script {self.target!r} does not exist",
                              hint="give the path of your training script, or -m MODULE for a module")
        if self.rdzv_timeout_s <= 0:
            raise ConfigError(f"--rdzv-timeout {self.rdzv_timeout_s} must be positive", hint="e.g. 900 seconds")

    @property
    def multinode(self) -> bool:
        return parse_nnodes(self.nnodes)[1] > 1


@dataclass(frozen=True)
class LaunchResult:
    ok: bool
    log_dir: Path | None
    summary: str
    seconds: float


def worker_env(spec: LocalLaunchSpec, base: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """The variables trainscale adds for the workers, and a note for each one it chose."""
    base = dict(os.environ if base is None else base)
    extra, notes = dict(spec.env), []
    if "OMP_NUM_THREADS" not in base and "OMP_NUM_THREADS" not in extra:
        from trainscale.runtime.threads import threads_per_rank, usable_cores

        n = threads_per_rank(spec.nproc_per_node)
        extra["OMP_NUM_THREADS"] = str(n)
        notes.append(f"OMP_NUM_THREADS={n} ({usable_cores()} cores / {spec.nproc_per_node} ranks)")
    extra.setdefault("PYTHONUNBUFFERED", "1")
    # torch 2.13's c10d rendezvous shares one TCPStore with the workers for the agent's whole life,
    # so a restarted group reads the dead group's gloo/NCCL addresses and fails to connect. With
    # sharing off, every restart gets a fresh store on a fresh port (tests/integration/test_faults.py).
    # Only a run that may restart needs that; the others keep the shared store, which reaches the
    # first step sooner (no second store for the workers to find: benchmarks/launch_overhead.py).
    if spec.max_restarts > 0:
        extra.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    return extra, notes


def _rendezvous(spec: LocalLaunchSpec) -> tuple[str, str, str]:
    """(backend, endpoint, run id) — a private free port on loopback for a single-node run."""
    run_id = spec.rdzv_id or f"trainscale-{uuid.uuid4().hex[:12]}"
    if spec.rdzv_endpoint:
        host, port = parse_endpoint(spec.rdzv_endpoint)
        resolve(host)
        # The node that hosts the store must find its port free: otherwise c10d would quietly join
        # whatever already listens there (another job). Other nodes connect to it, so they skip this.
        if not spec.multinode or spec.node_rank == 0:
            check_port_free(host, port)
        return spec.rdzv_backend, f"{host}:{port}", run_id
    if spec.multinode:
        raise ConfigError("several nodes but no --rdzv-endpoint", hint="give --rdzv-endpoint FIRST_NODE:PORT on every node")
    port = free_port("127.0.0.1")
    check_port_free("127.0.0.1", port)
    return "c10d", f"127.0.0.1:{port}", run_id


def launch(spec: LocalLaunchSpec) -> LaunchResult:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    from trainscale.launch import summary

    backend, endpoint, run_id = _rendezvous(spec)
    if backend == "c10d":
        from trainscale.launch.rendezvous import register

        backend = register()  # c10d with the store bound to the endpoint's address only
    low, high = parse_nnodes(spec.nnodes)
    log_root = Path(spec.log_dir or Path("trainscale-logs")).absolute()
    log_root.mkdir(parents=True, exist_ok=True)
    logs = DefaultLogsSpecs(log_dir=str(log_root), redirects=Std.ALL, tee=Std.ALL,
                            local_ranks_filter=None if spec.console_all_ranks else {0})
    rdzv_configs: dict = {"timeout": spec.rdzv_timeout_s, "join_timeout": spec.rdzv_timeout_s}
    if backend == "static":
        rdzv_configs = {"rank": spec.node_rank or 0, "timeout": spec.rdzv_timeout_s}
    elif not spec.multinode:
        rdzv_configs["is_host"] = True
    config = LaunchConfig(
        min_nodes=low, max_nodes=high, nproc_per_node=spec.nproc_per_node, logs_specs=logs, run_id=run_id,
        rdzv_endpoint=endpoint, rdzv_backend=backend, rdzv_configs=rdzv_configs, max_restarts=spec.max_restarts,
        monitor_interval=0.1, start_method="spawn",
        log_line_prefix_template="[rank${rank}]: ", role="trainscale",
        local_addr=None if spec.multinode else "127.0.0.1",  # a single node talks over loopback only
    )
    extra, notes = worker_env(spec)
    for note in notes:
        print(f"trainscale: set {note}; export it yourself to override", file=sys.stderr, flush=True)
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)  # the agent copies os.environ into each worker
    entry_args = ["-m", "trainscale.launch.bootstrap", "--module" if spec.module else "--script",
                  spec.target if spec.module else str(Path(spec.target).absolute()), *spec.args]
    started = time.monotonic()
    previous = _forward_to_workers(FORWARDED_SIGNALS)
    try:
        elastic_launch(config, sys.executable)(*entry_args)
        return LaunchResult(True, _run_dir(log_root, run_id), "", time.monotonic() - started)
    except ChildFailedError as exc:
        run_dir = _run_dir(log_root, run_id)
        failures = summary.from_child_failed(exc, _stderr_logs(run_dir))
        world = spec.nproc_per_node * low if low == high else None
        text = summary.render(failures, world_size=world, log_dir=run_dir)
        return LaunchResult(False, run_dir, text, time.monotonic() - started)
    except Exception as exc:  # rendezvous timeouts and closed stores surface here
        name = type(exc).__name__
        if "Rendezvous" in name or "Timeout" in name:
            raise LaunchError(f"rendezvous at {endpoint} (run id {run_id}) failed: not all of the {low} node(s) "
                              f"arrived within {spec.rdzv_timeout_s}s ({name}{': ' + str(exc) if str(exc) else ''})",
                              hint=f"start `trainscale run` on all {low} nodes with the same --rdzv-endpoint and "
                                   f"--rdzv-id, check the first node is reachable, or raise --rdzv-timeout") from None
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


FORWARDED_SIGNALS = (signal.SIGUSR1, signal.SIGUSR2)
"""SLURM's warning signals (``--signal=USR1@90``): the agent passes them on to its workers, whose
trainscale runtime checkpoints at the next step boundary. (torchrun's agent would die of them.)"""


def _forward_to_workers(signals: tuple[int, ...]) -> dict[int, object]:
    import psutil

    def forward(signum, frame) -> None:
        for child in psutil.Process().children(recursive=True):
            try:
                if "trainscale.launch.bootstrap" in " ".join(child.cmdline()):
                    child.send_signal(signum)
            except psutil.Error:
                continue

    previous = {}
    for sig in signals:
        try:
            previous[sig] = signal.signal(sig, forward)
        except ValueError:  # not the main thread (launched from a library call): leave signals alone
            break
    return previous


def _run_dir(log_root: Path, run_id: str) -> Path | None:
    """The agent makes ``<log_root>/<run_id>_<random>/attempt_<k>/<local_rank>/std{out,err}.log``."""
    found = sorted(log_root.glob(f"{run_id}_*"), key=lambda p: p.stat().st_mtime)
    return found[-1] if found else None


def _stderr_logs(run_dir: Path | None) -> dict[int, Path]:
    """local rank -> its stderr log in the newest attempt."""
    if run_dir is None or not run_dir.exists():
        return {}
    attempts = sorted(run_dir.glob("attempt_*"), key=lambda p: int(p.name.split("_")[1]))
    if not attempts:
        return {}
    return {int(d.name): d / "stderr.log" for d in attempts[-1].iterdir() if d.name.isdigit()}
