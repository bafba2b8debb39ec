"""Launch N workers on this node (and join other nodes) through torch.distributed.run's Python API.

Plan, then do: :class:`LocalLaunchSpec` is validated at construction (before any process starts);
:func:`launch` hands it to ``torch.distributed.launcher.api.elastic_launch``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from multiprocessing import process, util
from pathlib import Path
from typing import Any

from trainscale.errors import HUNG_EXIT, ConfigError, LaunchError
from trainscale.launch import bootstrap
from trainscale.launch.bootstrap import (
    AGENT_VAR,
    FORKSERVER_BLOCKS,
    HANG_TIMEOUT_VAR,
    PREFIXED_VAR,
    RUN_DIR_VAR,
    forked,
)
from trainscale.launch.ports import check_port_free, choose, importable, parse_endpoint, resolve
from trainscale.launch.torchrun import LOGGING_OPTIONS, defaults
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
    """Where run directories go (torchrun's --log-dir; default ./trainscale-runs): one new directory per run
    holds its records, every attempt's per-rank logs and what ran (launch/rundir.py)."""
    run_dir: Path | None = None
    """This run's directory itself, made by the caller (bench: one per configuration); default: a new one
    under ``log_dir``."""
    console_all_ranks: bool = False
    """Show every rank's output on the console (prefixed); default: rank 0 only."""
    rdzv_timeout_s: int = 900
    """How long to wait for all nodes to arrive (torchrun's rdzv-conf timeout/join_timeout win)."""
    hang_timeout_s: float | None = None
    """End the job after this long with no progress on any rank (0: never); None: the workers' default
    (runtime/hangwatch/heartbeat.py, ``DEFAULT_HANG_TIMEOUT_S`` once training steps ran)."""
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
            raise ConfigError(
                "both -m/--module and --no-python",
                hint="use -m for a Python module, --no-python for a program that is not Python (as torchrun)",
            )
        if self.module:
            if not importable(self.target):
                raise ConfigError(
                    f"module {self.target!r} cannot be found", hint="check the name and that it is installed"
                )
        elif self.no_python:
            if not (Path(self.target).is_file() or shutil.which(self.target)):
                raise ConfigError(f"program {self.target!r} does not exist", hint="give a path or a command on PATH")
        elif not Path(self.target).is_file():
            raise ConfigError(
                f"script {self.target!r} does not exist",
                hint="give the path of your training script, or -m MODULE for a module",
            )
        if self.rdzv_timeout_s <= 0:
            raise ConfigError(f"--rdzv-timeout {self.rdzv_timeout_s} must be positive", hint="e.g. 900 seconds")
        if self.hang_timeout_s is not None and not 0 <= self.hang_timeout_s < float("inf"):
            raise ConfigError(
                f"--hang-timeout {self.hang_timeout_s:g} must be 0 (never) or more seconds",
                hint="e.g. --hang-timeout 600",
            )
        if self.torchrun.get("rdzv_backend") == "":
            raise ConfigError("--rdzv-backend is empty", hint="use c10d (or static with --master-addr/--master-port)")
        _check_log_dir(self.torchrun.get("log_dir") or self.log_dir)

    @property
    def multinode(self) -> bool:
        return parse_nnodes(self.nnodes)[1] > 1

    def given(self, name: str) -> bool:
        return name in self.torchrun


def _check_log_dir(path: str | Path | None) -> None:
    """--log-dir must be a directory or one that can be made: refused before launch, not at mkdir."""
    if path is None:
        return
    wanted = Path(path)
    for place in (wanted, *wanted.absolute().parents):
        if place.exists():
            if not place.is_dir():
                seen = (
                    f"--log-dir {path} is a file, not a directory"
                    if place == wanted
                    else f"--log-dir {path} is under {place}, which is a file"
                )
                raise ConfigError(
                    seen,
                    hint="give a directory (it is created if missing), or leave --log-dir out for ./trainscale-runs",
                )
            if not os.access(place, os.W_OK | os.X_OK):
                raise ConfigError(
                    f"--log-dir {path}: {place} is not writable",
                    hint="give a directory you can write, or leave --log-dir out for ./trainscale-runs",
                )
            return


@dataclass(frozen=True)
class LaunchResult:
    ok: bool
    log_dir: Path | None
    """This node's per-rank logs (``attempt_<k>/<local rank>/``): the run directory unless the records had
    a home already (``TRAINSCALE_RUN_DIR``)."""
    summary: str
    seconds: float
    run_dir: Path | None = None
    """Where the ranks' records went: what ``trainscale report`` reads."""
    signal: int | None = None
    """The signal that stopped the launcher (its workers were stopped); None when the run ended by itself."""
    attempts: tuple = ()
    """summary.Attempt per run of the worker group when it was restarted; empty for a single attempt."""
    exit_code: int = 1
    """`trainscale run`'s exit status for a failed run: 124 (errors.HUNG_EXIT) when a hang ended it."""


def worker_env(spec: LocalLaunchSpec, base: dict[str, str] | None = None) -> tuple[dict[str, str], list[str]]:
    """The variables trainscale adds for the workers, and a note for each one it chose."""
    base = dict(os.environ if base is None else base)
    extra, notes = dict(spec.env), []
    if "OMP_NUM_THREADS" not in base and "OMP_NUM_THREADS" not in extra:
        from trainscale.runtime.threads import threads_per_rank, usable_cores  # noqa: PLC0415 (torch-free module)

        n = threads_per_rank(spec.nproc_per_node)
        extra["OMP_NUM_THREADS"] = str(n)
        notes.append(f"OMP_NUM_THREADS={n} ({usable_cores()} cores / {spec.nproc_per_node} ranks)")
    extra.setdefault("PYTHONUNBUFFERED", "1")
    if spec.hang_timeout_s is not None:
        extra[HANG_TIMEOUT_VAR] = f"{spec.hang_timeout_s:g}"
    if not LOGGING_OPTIONS & set(spec.torchrun):  # trainscale's console: the agent prefixes every shown line
        extra[PREFIXED_VAR] = "1"
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
    """torchrun's rendezvous choice, with trainscale's store bound to the endpoint's address where torchrun
    would listen everywhere (docs/launch.md, "single-node rendezvous"); ports it listens on are checked free
    first. A single node with no endpoint and no ``--master-port`` is standalone, as torchrun's own shortcut."""
    from torch.distributed.elastic.rendezvous.utils import _parse_rendezvous_config  # noqa: PLC0415 (torch-free module)

    opts = {**defaults, **spec.torchrun}
    low, high = parse_nnodes(spec.nnodes)
    run_id = opts["rdzv_id"] if spec.given("rdzv_id") else f"trainscale-{uuid.uuid4().hex[:12]}"
    try:
        configs = _parse_rendezvous_config(opts["rdzv_conf"] or "")
    except ValueError as exc:
        raise ConfigError(f"--rdzv-conf {opts['rdzv_conf']!r}: {exc}", hint="write KEY=VALUE,KEY=VALUE") from None
    backend, endpoint = opts["rdzv_backend"], opts["rdzv_endpoint"]
    timeouts = {"timeout": spec.rdzv_timeout_s, "join_timeout": spec.rdzv_timeout_s}
    standalone = opts["standalone"] or (
        backend == "static" and not endpoint and not spec.given("master_port") and high == 1
    )
    if standalone:
        if high > 1:
            raise ConfigError(
                f"--standalone with --nnodes {spec.nnodes}: a standalone rendezvous is one node",
                hint="drop --standalone and give every node --rdzv-backend c10d --rdzv-endpoint FIRST:PORT",
            )
        port = choose("127.0.0.1")
        run_id = f"trainscale-{uuid.uuid4().hex[:12]}"  # torchrun too ignores --rdzv-id with --standalone
        return Rendezvous("c10d", f"127.0.0.1:{port}", run_id, {**timeouts, **configs, "is_host": True})
    if backend == "static":
        if not endpoint:
            if high > 1 and not (spec.given("master_addr") and spec.given("master_port")):
                raise ConfigError(
                    f"--nnodes {spec.nnodes} but no --master-addr/--master-port (or --rdzv-endpoint)",
                    hint="give every node --master-addr FIRST_NODE --master-port PORT --node-rank K, or "
                    "--rdzv-backend c10d --rdzv-endpoint FIRST_NODE:PORT",
                )
            endpoint = f"{opts['master_addr']}:{opts['master_port'] or 29500}"
        host, port = parse_endpoint(endpoint, default_port=29500)
        resolve(host)
        if int(opts["node_rank"]) == 0:  # node 0 hosts the store: its port must be free there
            check_port_free(host, port)
        return Rendezvous("static", endpoint, run_id, {"rank": int(opts["node_rank"]), **timeouts, **configs})
    if backend == "c10d":
        if not endpoint:
            raise ConfigError(
                f"--rdzv-backend c10d with --nnodes {spec.nnodes} but no --rdzv-endpoint",
                hint="give every node --rdzv-endpoint FIRST_NODE:PORT (or --standalone on one node)",
            )
        host, port = parse_endpoint(endpoint)
        resolve(host)
        # The node that hosts the store must find its port free: otherwise c10d would quietly join
        # whatever already listens there (another job). Other nodes connect to it, so they skip this.
        if not spec.multinode:
            check_port_free(host, port)
            configs.setdefault("is_host", True)
        return Rendezvous("c10d", f"{host}:{port}", run_id, {**timeouts, **configs})
    return Rendezvous(backend, endpoint, run_id, {**timeouts, **configs})  # etcd, etcd-v2, a plugin: torch's own


def _console(spec: LocalLaunchSpec) -> dict[str, str]:
    """torchrun's redirects, tee and local_ranks_filter as trainscale defaults them, unless the user gave any
    of the logging options (then torchrun's, as given or defaulted)."""
    if LOGGING_OPTIONS & set(spec.torchrun):
        return {}
    return {"redirects": "3", "tee": "3", "local_ranks_filter": "" if spec.console_all_ranks else "0"}


def launch_config(spec: LocalLaunchSpec, log_root: Path):
    """The LaunchConfig torchrun would build from the same options, then trainscale's defaults where
    the user gave none: rendezvous store, console and log files, loopback for one node."""
    from torch.distributed.run import config_from_args  # noqa: PLC0415 (torch-free module)

    base = vars(defaults())
    opts = {
        **base,
        **spec.torchrun,
        "nproc_per_node": str(spec.nproc_per_node),
        "nnodes": spec.nnodes,
        "max_restarts": spec.max_restarts,
        "log_dir": str(log_root),
        **_console(spec),
    }
    rdzv = plan_rendezvous(spec, base)  # before anything is written (torch's logs spec makes the log directory)
    omp = os.environ.get("OMP_NUM_THREADS")
    try:
        config, _, _ = config_from_args(argparse.Namespace(**opts))
    finally:  # torch sets OMP_NUM_THREADS=1 for the workers when unset; trainscale's worker_env decides that
        if omp is None:
            os.environ.pop("OMP_NUM_THREADS", None)
    backend = rdzv.backend
    if backend in ("c10d", "static"):
        from trainscale.launch.rendezvous import register  # noqa: PLC0415 (CLI start-up)

        backend = register(backend)  # torch's, with the store bound to the endpoint's address only
    changes: dict[str, Any] = {
        "rdzv_backend": backend,
        "rdzv_endpoint": rdzv.endpoint,
        "run_id": rdzv.run_id,
        "rdzv_configs": rdzv.configs,
    }
    if not os.environ.get("TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE"):
        changes["log_line_prefix_template"] = "[rank${rank}]: "
    if not spec.given("local_addr") and not spec.multinode:
        changes["local_addr"] = "127.0.0.1"  # a single node talks over loopback only
    return dataclasses.replace(config, **changes)


FORKSERVER_PRELOAD = ("trainscale.launch.forkserver",)
"""What the forkserver of trainscale's own workers imports once for the node (launch/forkserver.py)."""


def own_worker(spec: LocalLaunchSpec) -> bool:
    """A module of trainscale's own (a workload, the all-reduce of doctor and selftest), launched from
    trainscale's command line on the interpreter it runs on with torchrun's default start method here: its
    workers are forked from a preloaded forkserver (:func:`entrypoint`; bootstrap.FORK_OWN_WORKERS says why
    only there). ``--start-method spawn`` or ``fork`` gives them fresh interpreters, as a script's."""
    return (
        bootstrap.FORK_OWN_WORKERS
        and bool(spec.module)
        and spec.target.split(".")[0] == "trainscale"
        and spec.torchrun.get("start_method", "forkserver") == "forkserver"
        and sys.platform.startswith("linux")
        and "PYTHON_EXEC" not in os.environ
    )


def start_forkserver() -> None:
    """Start the forkserver now (its import of torch overlaps the rendezvous), with multiprocessing's
    resource tracker, both with FORKSERVER_BLOCKS blocked: srun passes SLURM's warning signal (and scancel
    its SIGTERM) to every process of the step, a terminal its SIGHUP to every process of the group; the
    launcher answers those for its workers, and the forkserver must not die of one (its workers would
    die with it). A blocked signal stays blocked across exec, and one sent meanwhile waits: each worker
    unblocks them first and then gets it (bootstrap.forked)."""
    from multiprocessing import forkserver  # noqa: PLC0415 (CLI start-up)

    _short_socket_dir()
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, FORKSERVER_BLOCKS)  # this thread's: what it starts inherits
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _short_socket_dir() -> None:
    """multiprocessing puts its forkserver's socket in a folder it makes under TMPDIR; under a long TMPDIR that path
    passes AF_UNIX's 108 bytes and the launch fails ("AF_UNIX path too long"; Python 3.13 falls back to /tmp by
    itself). Where it would, the folder goes under /tmp instead (removed at exit, as multiprocessing's own is)."""
    config = process.current_process()._config
    if config.get("tempdir") is None and len(tempfile.gettempdir()) + 40 > 107 and os.path.isdir("/tmp"):
        folder = tempfile.mkdtemp(prefix="pymp-", dir="/tmp")
        util.Finalize(None, shutil.rmtree, args=(folder, True), exitpriority=-100)
        config["tempdir"] = folder


def entrypoint(spec: LocalLaunchSpec) -> tuple[Any, list[Any]]:
    """What each worker runs: trainscale's bootstrap around the script, module or program.

    A user's script or program gets a fresh interpreter, as under torchrun. trainscale's own modules run
    as torch's function entrypoint, forked from a forkserver that imported torch once (docs/launch.md,
    "Workers of trainscale's own"): on a node of 8 ranks that is one import of torch from the parallel
    filesystem instead of 8. Its arguments are the bootstrap's, each a string of its own, so that torch's
    agent replaces ``${local_rank}`` in them as it does in a script's."""
    kind = "--exec" if spec.no_python else "--module" if spec.module else "--script"
    target = str(Path(spec.target).absolute()) if kind == "--script" else spec.target
    if own_worker(spec):
        multiprocessing.set_forkserver_preload(list(FORKSERVER_PRELOAD))
        start_forkserver()
        return forked, [{"environ": dict(os.environ), "cwd": os.getcwd()}, kind, target, *spec.args]
    python = os.environ.get("PYTHON_EXEC", sys.executable)  # torchrun's override of the interpreter
    return python, ["-u", "-m", "trainscale.launch.bootstrap", kind, target, *spec.args]


def launch(spec: LocalLaunchSpec) -> LaunchResult:
    """Run the workers to the end. A failed run, and a launcher stopped by a signal (whose workers
    torch's agent then stops), come back as a result with its summary, never as torch's traceback."""
    from torch.distributed.elastic.multiprocessing.api import SignalException  # noqa: PLC0415 (torch-free module)
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError  # noqa: PLC0415 (torch-free module)
    from torch.distributed.launcher.api import elastic_launch  # noqa: PLC0415 (torch-free module)

    from trainscale.launch import rundir, summary  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.agent import take_signals, watching  # noqa: PLC0415 (CLI start-up)

    log_root = Path(spec.run_dir or spec.torchrun.get("log_dir") or spec.log_dir or rundir.DEFAULT_ROOT).absolute()
    extra, notes = worker_env(spec)
    if spec.given("numa_binding") and (extra.pop(PLAN_ENV, None) or os.environ.get(PLAN_ENV)):
        extra[PLAN_ENV] = "none"
        notes.append(f"{PLAN_ENV}=none: --numa-binding {spec.torchrun['numa_binding']} binds the workers instead")
    for note in notes:
        print(f"trainscale: set {note}; export it yourself to override", file=sys.stderr, flush=True)
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)  # the agent copies os.environ into each worker (and torch reads OMP_NUM_THREADS)
    started = time.monotonic()
    restore_signals = take_signals()
    config = logs = run_dir = watch = None

    def ended(ok: bool, summary_text: str = "", **fields: Any) -> LaunchResult:
        """The result, with its outcome in the run's run.json once the run has directories."""
        if logs is not None:
            rundir.end_record(logs, run_dir, ok=ok, seconds=time.monotonic() - started, summary=summary_text)
        return LaunchResult(ok, logs, summary_text, time.monotonic() - started, run_dir, **fields)

    try:
        config = launch_config(spec, log_root)  # checks the rendezvous before anything is written
        logs, run_dir = _directories(spec, log_root)
        saved.setdefault(RUN_DIR_VAR, os.environ.get(RUN_DIR_VAR))
        os.environ[RUN_DIR_VAR] = str(run_dir)  # where the ranks' own records go
        saved.setdefault(AGENT_VAR, os.environ.get(AGENT_VAR))
        os.environ[AGENT_VAR] = f"{os.getpid()}:{config.run_id}"  # the workers die with it (bootstrap.py)
        if not spec.given("logs_specs"):  # torch's agent writes every attempt's logs into the run directory
            console = {**vars(defaults()), **spec.torchrun, **_console(spec)}
            config = dataclasses.replace(
                config,
                logs_specs=rundir.logs_specs(
                    logs, **{key: console[key] for key in ("redirects", "tee", "local_ranks_filter")}
                ),
            )
        spec = dataclasses.replace(
            spec,
            args=rundir.checkpoint_args(
                spec.target, spec.args, module=spec.module, max_restarts=spec.max_restarts, run_dir=run_dir
            ),
        )
        target, args = entrypoint(spec)
        if callable(target) and not spec.given("start_method"):  # torchrun's --start-method chooses otherwise
            config = dataclasses.replace(config, start_method="forkserver")
        say = functools.partial(print, file=sys.stderr, flush=True)
        with watching(spec.max_restarts + 1, say, lambda: str(run_dir)) as watch:
            elastic_launch(config, target)(*args)
        return ended(True, attempts=tuple(watch.history(finished=True)))
    except ChildFailedError as exc:
        failures = summary.from_child_failed(exc, _stderr_logs(logs))
        world = None if spec.multinode else spec.nproc_per_node  # on several nodes, the others' agents name theirs
        history = watch.history(failures[0] if failures else None) if watch else []
        text = summary.render(
            failures, world_size=world, log_dir=logs, attempts=history, total_attempts=spec.max_restarts + 1
        )
        _dump_root_cause(exc, failures[0].rank if failures else None)
        hung = bool(failures) and failures[0].exitcode == HUNG_EXIT
        return ended(False, text, attempts=tuple(history), exit_code=HUNG_EXIT if hung else 1)
    except KeyboardInterrupt:  # Ctrl-C before torch's agent took the signal over: no worker was started
        return ended(
            False,
            "trainscale: received SIGINT before any rank started; nothing is left running",
            signal=int(signal.SIGINT),
        )
    except SignalException as exc:  # torch's agent has stopped the workers (SIGTERM, then SIGKILL)
        workers = (watch.workers if watch is not None else 0) or spec.nproc_per_node
        return ended(False, summary.stopped_line(int(exc.sigval), workers, logs or log_root), signal=int(exc.sigval))
    except Exception as exc:  # rendezvous timeouts and closed stores surface here
        name = type(exc).__name__
        store_wait = name == "DistStoreError" and "waiting for clients" in str(exc)  # static rendezvous
        if config is not None and ("Rendezvous" in name or "Timeout" in name or store_wait):
            low = parse_nnodes(spec.nnodes)[0]
            raise LaunchError(
                f"rendezvous at {config.rdzv_endpoint} (run id {config.run_id}) failed: not all of the "
                f"{low} node(s) arrived within {spec.rdzv_timeout_s}s "
                f"({name}{': ' + str(exc) if str(exc) else ''})",
                hint=f"start `trainscale run` on all {low} nodes with the same --rdzv-endpoint and "
                f"--rdzv-id, check the first node is reachable, or raise --rdzv-timeout",
            ) from None
        raise
    finally:
        restore_signals()
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
    from torch.distributed.elastic.multiprocessing.errors import get_error_handler  # noqa: PLC0415 (torch-free module)

    failure = exc.failures.get(rank) if rank is not None else None
    if failure is None:
        _, failure = exc.get_first_failure()
    if failure.error_file and os.path.isfile(failure.error_file):
        get_error_handler().dump_error_file(failure.error_file, failure.exitcode)


def _directories(spec: LocalLaunchSpec, log_root: Path) -> tuple[Path, Path]:
    """(this node's logs, the run directory the records go to): one new directory, or the caller's
    (``spec.run_dir``); records whose home is set already (a SLURM job's run) stay there."""
    from trainscale.launch import rundir  # noqa: PLC0415 (CLI start-up)

    if spec.run_dir is not None:
        logs = run = spec.run_dir.absolute()
        logs.mkdir(parents=True, exist_ok=True)
    else:
        logs = rundir.create(
            log_root, rundir.label(spec.target, spec.args, module=spec.module), multinode=spec.multinode
        )
        run = Path(os.environ[RUN_DIR_VAR]).absolute() if os.environ.get(RUN_DIR_VAR) else logs
    # what ran goes beside the logs, and beside the records when nothing there says it (a SLURM run has
    # its submission.json; a directory of the user's own, a sweep's task, has nothing)
    for where in (logs, run) if run == logs or rundir.describes_itself(run) else (logs,):
        rundir.start_record(
            where,
            target=spec.target,
            args=spec.args,
            module=spec.module,
            no_python=spec.no_python,
            nproc_per_node=spec.nproc_per_node,
            nnodes=spec.nnodes,
            max_restarts=spec.max_restarts,
            records=run,
            logs=logs,
        )
    return logs, run


def _stderr_logs(run_dir: Path) -> dict[int, Path]:
    """local rank -> its stderr log in the newest attempt."""
    attempts = sorted(run_dir.glob("attempt_*"), key=lambda p: int(p.name.split("_")[1]))
    return {int(d.name): d / "stderr.log" for d in attempts[-1].iterdir() if d.name.isdigit()} if attempts else {}
