"""Launch N workers on this node (and join other nodes) through torch.distributed.run's Python API.

Plan, then do: :class:`LocalLaunchSpec` is validated at construction (before any process starts);
:func:`launch` hands it to ``torch.distributed.launcher.api.elastic_launch``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from trainscale.errors import ConfigError, LaunchError
from trainscale.launch.ports import check_port_free, free_port, parse_endpoint, resolve
from trainscale.launch.torchrun import LOGGING_OPTIONS
from trainscale.topology.worker import PLAN_ENV

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
    """Path of the training script, a module name with ``module=True``, a program with ``no_python=True``."""
    args: tuple[str, ...] = ()
    """Arguments passed to the script."""
    module: bool = False
    """Run ``target`` as ``python -m target``."""
    no_python: bool = False
    """Run ``target`` as a program, not with Python (torchrun's ``--no-python``)."""
    nproc_per_node: int = 1
    """Workers on this node (already resolved from auto/cpu/gpu)."""
    nnodes: str = "1"
    """Nodes: N or MIN:MAX (elastic)."""
    max_restarts: int = 0
    """Restarts of the whole worker group after a failure."""
    log_dir: Path | None = None
    """Where each rank's stdout/stderr go; a new directory per run under it (default ./trainscale-logs)."""
    console_all_ranks: bool = False
    """Show every rank's output on the console (prefixed); default: rank 0 only."""
    rdzv_timeout_s: int = 900
    """How long to wait for all nodes to arrive (torchrun's rdzv-conf timeout/join_timeout win)."""
    torchrun: Mapping[str, Any] = field(default_factory=dict)
    """The other torchrun options the user gave (dest -> value, as torch's parser reads them); each
    wins over trainscale's default for it. Options not given keep torchrun's or trainscale's default."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the workers."""

    def __post_init__(self) -> None:
        if self.nproc_per_node < 1:
            raise ConfigError(f"nproc_per_node={self.nproc_per_node}", hint="use 1 or more")
        parse_nnodes(self.nnodes)
        if self.max_restarts < 0:
            raise ConfigError(f"--max-restarts {self.max_restarts} is negative", hint="use 0 (fail fast) or more")
        if self.module and self.no_python:
            raise ConfigError("both -m/--module and --no-python", hint="use -m for a Python module, --no-python for a "
                                                                      "program that is not Python (as torchrun)")
        if self.module:
            import importlib.util

            try:
                found = importlib.util.find_spec(self.target)
            except (ImportError, ValueError):
                found = None
            if found is None:
                raise ConfigError(f"module {self.target!r} cannot be found", hint="check the name and that it is installed")
        elif self.no_python:
            if not (Path(self.target).is_file() or shutil.which(self.target)):
                raise ConfigError(f"program {self.target!r} does not exist", hint="give a path or a command on PATH")
        elif not Path(self.target).is_file():
            raise ConfigError(f"script {self.target!r} does not exist",
                              hint="give the path of your training script, or -m MODULE for a module")
        if self.rdzv_timeout_s <= 0:
            raise ConfigError(f"--rdzv-timeout {self.rdzv_timeout_s} must be positive", hint="e.g. 900 seconds")
        backend = self.torchrun.get("rdzv_backend")
        if backend is not None and not backend:
            raise ConfigError("--rdzv-backend is empty", hint="use c10d (or static with --master-addr/--master-port)")

    @property
    def multinode(self) -> bool:
        return parse_nnodes(self.nnodes)[1] > 1

    def given(self, name: str) -> bool:
        return name in self.torchrun


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


@dataclass(frozen=True)
class Rendezvous:
    backend: str
    endpoint: str
    run_id: str
    configs: dict


def plan_rendezvous(spec: LocalLaunchSpec, defaults: Mapping[str, Any]) -> Rendezvous:
    """torchrun's rendezvous choice, with trainscale's store where torchrun would use a c10d one.

    ``--standalone`` (or a single node with no endpoint and no ``--master-port``: torchrun's own
    shortcut) gets a private free port on 127.0.0.1; ``--rdzv-backend c10d --rdzv-endpoint H:P`` gets
    the c10d store bound to H's address only; ``static`` (``--master-addr/--master-port/--node-rank``)
    and other backends are torch's own. Ports the store will listen on are checked free first.
    """
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config

    opts = {**defaults, **spec.torchrun}
    low, high = parse_nnodes(spec.nnodes)
    run_id = opts["rdzv_id"] if spec.given("rdzv_id") else f"trainscale-{uuid.uuid4().hex[:12]}"
    try:
        configs = _parse_rendezvous_config(opts["rdzv_conf"] or "")
    except ValueError as exc:
        raise ConfigError(f"--rdzv-conf {opts['rdzv_conf']!r}: {exc}", hint="write KEY=VALUE,KEY=VALUE") from None
    backend, endpoint = opts["rdzv_backend"], opts["rdzv_endpoint"]
    timeouts = {"timeout": spec.rdzv_timeout_s, "join_timeout": spec.rdzv_timeout_s}
    standalone = opts["standalone"] or (backend == "static" and not endpoint and not spec.given("master_port")
                                        and high == 1)
    if standalone:
        if high > 1:
            raise ConfigError(f"--standalone with --nnodes {spec.nnodes}: a standalone rendezvous is one node",
                              hint="drop --standalone and give every node --rdzv-backend c10d --rdzv-endpoint FIRST:PORT")
        port = free_port("127.0.0.1")
        check_port_free("127.0.0.1", port)
        run_id = f"trainscale-{uuid.uuid4().hex[:12]}"  # torchrun too ignores --rdzv-id with --standalone
        return Rendezvous("c10d", f"127.0.0.1:{port}", run_id, {**timeouts, **configs, "is_host": True})
    if backend == "static":
        if not endpoint:
            if high > 1 and not (spec.given("master_addr") and spec.given("master_port")):
                raise ConfigError(f"--nnodes {spec.nnodes} but no --master-addr/--master-port (or --rdzv-endpoint)",
                                  hint="give every node --master-addr FIRST_NODE --master-port PORT --node-rank K, or "
                                       "--rdzv-backend c10d --rdzv-endpoint FIRST_NODE:PORT")
            endpoint = f"{opts['master_addr']}:{opts['master_port'] or 29500}"
        host, port = parse_endpoint(endpoint, default_port=29500)
        resolve(host)
        if int(opts["node_rank"]) == 0:  # node 0 hosts the store: its port must be free there
            check_port_free(host, port)
        return Rendezvous("static", endpoint, run_id, {"rank": int(opts["node_rank"]), **timeouts, **configs})
    if backend == "c10d":
        if not endpoint:
            raise ConfigError(f"--rdzv-backend c10d with --nnodes {spec.nnodes} but no --rdzv-endpoint",
                              hint="give every node --rdzv-endpoint FIRST_NODE:PORT (or --standalone on one node)")
        host, port = parse_endpoint(endpoint)
        resolve(host)
        # The node that hosts the store must find its port free: otherwise c10d would quietly join
        # whatever already listens there (another job). Other nodes connect to it, so they skip this.
        if not spec.multinode:
            check_port_free(host, port)
            configs.setdefault("is_host", True)
        return Rendezvous("c10d", f"{host}:{port}", run_id, {**timeouts, **configs})
    return Rendezvous(backend, endpoint, run_id, {**timeouts, **configs})  # etcd, etcd-v2, a plugin: torch's own


def _logging(spec: LocalLaunchSpec, opts: dict, log_root: Path) -> dict:
    """torchrun's logging options as trainscale defaults them, unless the user gave any of them."""
    if LOGGING_OPTIONS & set(spec.torchrun):
        return {"log_dir": str(log_root)}  # torchrun's redirects/tee/filter as given or defaulted
    return {"log_dir": str(log_root), "redirects": "3", "tee": "3",
            "local_ranks_filter": "" if spec.console_all_ranks else "0"}


def launch_config(spec: LocalLaunchSpec, log_root: Path):
    """The LaunchConfig torchrun would build from the same options, then trainscale's defaults where
    the user gave none: rendezvous store, console and log files, loopback for one node."""
    from torch.distributed.run import config_from_args

    from trainscale.launch.torchrun import defaults

    base = vars(defaults())
    opts = {**base, **spec.torchrun, "nproc_per_node": str(spec.nproc_per_node), "nnodes": spec.nnodes,
            "max_restarts": spec.max_restarts}
    opts.update(_logging(spec, opts, log_root))
    rdzv = plan_rendezvous(spec, base)  # before anything is written (torch's logs spec makes the log directory)
    omp = os.environ.get("OMP_NUM_THREADS")
    try:
        config, _, _ = config_from_args(argparse.Namespace(**opts))
    finally:  # torch sets OMP_NUM_THREADS=1 for the workers when unset; trainscale's worker_env decides that
        if omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
    backend = rdzv.backend
    if backend == "c10d":
        from trainscale.launch.rendezvous import register

        backend = register()  # c10d with the store bound to the endpoint's address only
    changes: dict[str, Any] = {"rdzv_backend": backend, "rdzv_endpoint": rdzv.endpoint, "run_id": rdzv.run_id,
                               "rdzv_configs": rdzv.configs}
    if not os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"):
        changes["log_line_prefix_template"] = "[rank${rank}]: "
    if not spec.given("local_addr") and not spec.multinode:
        changes["local_addr"] = "127.0.0.1"  # a single node talks over loopback only
    return dataclasses.replace(config, **changes)


def entrypoint(spec: LocalLaunchSpec) -> tuple[str, list[str]]:
    """What each worker runs: trainscale's bootstrap around the script, module or program."""
    python = os.environ.get("PYTHON_EXEC", sys.executable)  # torchrun's override of the interpreter
    if spec.no_python:
        kind, target = "--exec", spec.target
    elif spec.module:
        kind, target = "--module", spec.target
    else:
        kind, target = "--script", str(Path(spec.target).absolute())
    return python, ["-u", "-m", "trainscale.launch.bootstrap", kind, target, *spec.args]


def launch(spec: LocalLaunchSpec) -> LaunchResult:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    from trainscale.launch import summary

    log_root = Path(spec.torchrun.get("log_dir") or spec.log_dir or Path("trainscale-logs")).absolute()
    extra, notes = worker_env(spec)
    if spec.given("numa_binding") and (extra.pop(PLAN_ENV, None) or os.environ.get(PLAN_ENV)):
        extra[PLAN_ENV] = "none"
        notes.append(f"{PLAN_ENV}=none: --numa-binding {spec.torchrun['numa_binding']} binds the workers instead")
    for note in notes:
        print(f"trainscale: set {note}; export it yourself to override", file=sys.stderr, flush=True)
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)  # the agent copies os.environ into each worker (and torch reads OMP_NUM_THREADS)
    started = time.monotonic()
    previous = _forward_to_workers(FORWARDED_SIGNALS)
    config = None
    try:
        config = launch_config(spec, log_root)  # checks the rendezvous before anything is written
        log_root.mkdir(parents=True, exist_ok=True)
        if not os.environ.get(RUN_DIR_VAR):  # where the ranks' own records go (a SLURM job names its run's)
            saved.setdefault(RUN_DIR_VAR, None)
            os.environ[RUN_DIR_VAR] = str(log_root / config.run_id)
        python, args = entrypoint(spec)
        elastic_launch(config, python)(*args)
        return LaunchResult(True, _run_dir(log_root, config.run_id), "", time.monotonic() - started)
    except ChildFailedError as exc:
        run_dir = _run_dir(log_root, config.run_id)
        failures = summary.from_child_failed(exc, _stderr_logs(run_dir))
        high = parse_nnodes(spec.nnodes)[1]
        world = spec.nproc_per_node if high == 1 else None  # on several nodes, the others' agents name their ranks
        text = summary.render(failures, world_size=world, log_dir=run_dir)
        _dump_root_cause(exc, failures[0].rank if failures else None)
        return LaunchResult(False, run_dir, text, time.monotonic() - started)
    except Exception as exc:  # rendezvous timeouts and closed stores surface here
        name = type(exc).__name__
        store_wait = name == "DistStoreError" and "waiting for clients" in str(exc)  # static rendezvous
        if config is not None and ("Rendezvous" in name or "Timeout" in name or store_wait):
            low = parse_nnodes(spec.nnodes)[0]
            raise LaunchError(f"rendezvous at {config.rdzv_endpoint} (run id {config.run_id}) failed: not all of the "
                              f"{low} node(s) arrived within {spec.rdzv_timeout_s}s "
                              f"({name}{': ' + str(exc) if str(exc) else ''})",
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


def _dump_root_cause(exc, rank: int | None) -> None:
    """As torchrun's own ``@record`` main does: when the user set TORCHELASTIC_ERROR_FILE for the launcher
    (seed 003: ``TORCHELASTIC_ERROR_FILE=../error.json torchrun ...``), copy the root-cause worker's
    error file there, trainscale's first failing rank being the root cause."""
    if not os.environ.get("TORCHELASTIC_ERROR_FILE"):
        return
    from torch.distributed.elastic.multiprocessing.errors import get_error_handler

    failure = exc.failures.get(rank) if rank is not None else None
    if failure is None:
        _, failure = exc.get_first_failure()
    if failure.error_file and os.path.isfile(failure.error_file):
        get_error_handler().dump_error_file(failure.error_file, failure.exitcode)


RUN_DIR_VAR = "TRAINSCALE_RUN_DIR"
"""The run's directory for the ranks' records (metrics/): ``<log dir>/<run id>`` unless set already."""

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
