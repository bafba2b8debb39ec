"""What each worker runs first: give it a consistent world, bind its CPUs, then run the user's
script, module or program, recording its error.

Every worker, whoever started it, gets the same variables from the one launch environment trainscale
detects, so a torchrun-style and a SLURM-style script both see their own rank (the table and why:
docs/launch.md, "What every worker sees"). Like torchelastic's ``@record``, a failure writes the
worker's traceback to TORCHELASTIC_ERROR_FILE, so a summary shows it without the user decorating main().
How a worker ends (:func:`exit_cleanly`, :func:`die_with_parent`): docs/launch.md, "How a run ends".

Standard library only (trainscale.errors, trainscale.env, trainscale.topology and the observation it installs,
observe/worker.py, are too, until the script imports torch): a stock
container without trainscale runs this module from the job kit (launch/kit.py), and it imports torch
itself only ahead of trainscale's own modules (:func:`collector_paused`).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import faulthandler
import functools
import gc
import importlib
import io
import os
import runpy
import signal
import sys
import threading
import traceback
from collections.abc import Mapping, MutableMapping
from pathlib import Path
from typing import Any

from trainscale.errors import PEER_GONE, is_refusal, one_line, record_error, succeeded
from trainscale.observe.worker import (
    explain_hang,
    observe_when_torch_loads,
    observing,
    stop_observing,
    when_imported,
)

BIND_VAR = "TRAINSCALE_CPU_BIND"
"""The binding plan from the launcher; format in trainscale/topology/worker.py."""
ERROR_DIR_VAR = "TRAINSCALE_ERROR_DIR"
"""Directory for per-rank error files when no elastic agent sets TORCHELASTIC_ERROR_FILE (srun tasks)."""
TASK_GPU_VAR = "TRAINSCALE_TASK_GPU"
"""srun mode: the visibility variable (CUDA_VISIBLE_DEVICES or ROCR_VISIBLE_DEVICES) narrowed to this
task's own GPU, so a script using ``cuda``/``cuda:0`` is right on every rank."""
KIT_VAR = "TRAINSCALE_KIT"
"""Set by the kit's boot.py: the directory this module was imported from (removed before user code)."""
SNAPSHOT_VAR, SNAPSHOT_OF_VAR = "TRAINSCALE_SNAPSHOT", "TRAINSCALE_SNAPSHOT_OF"
"""A submitted job's copy of its code, and the directory it was copied from (launch/slurm/snapshot.py)."""
AGENT_VAR = "TRAINSCALE_AGENT"
"""Set by ``trainscale run``: ``PID:RUN_ID``, the process that runs torch's agent (the workers' parent)
and its run id; a value whose run id is not this worker's (TORCHELASTIC_RUN_ID) is another launch's."""
RUN_DIR_VAR = "TRAINSCALE_RUN_DIR"
"""The run's directory for the ranks' records (metrics/): `trainscale run`'s, a SLURM job's run, a sweep task's."""
PREFIXED_VAR = "TRAINSCALE_PREFIXED_CONSOLE"
"""Set by ``trainscale run`` when the agent prefixes every line a worker shows with ``[rankN]:``."""
HANG_TIMEOUT_VAR = "TRAINSCALE_HANG_TIMEOUT"
"""`--hang-timeout`'s seconds for the workers' hang watch (runtime/hangwatch/heartbeat.py)."""

# SLURM's task variables as torchrun's workers should see them: each agrees with RANK & co.
_SLURM_FROM_WORLD = (
    ("SLURM_PROCID", "rank"),
    ("SLURM_LOCALID", "local_rank"),
    ("SLURM_NODEID", "node_rank"),
    ("SLURM_NTASKS", "world_size"),
    ("SLURM_NPROCS", "world_size"),
    ("SLURM_STEP_NUM_TASKS", "world_size"),
    ("SLURM_NTASKS_PER_NODE", "local_world_size"),
    ("SLURM_NNODES", "num_nodes"),
    ("SLURM_STEP_NUM_NODES", "num_nodes"),
)


def world_env(env, *, rewrite_slurm: bool) -> dict[str, str]:
    """The variables a worker gets from its LaunchEnv ``env`` (trainscale.env.LaunchEnv).

    ``rewrite_slurm``: the worker was started by torchrun's agent, so SLURM's task variables it
    inherited describe the agent's task (one per node), not this worker: replace them with values that
    agree with its rank (SLURM_NODEID becomes the node's rank in the job as torchrun numbered it).
    """
    out = {
        "RANK": str(env.rank),
        "LOCAL_RANK": str(env.local_rank),
        "WORLD_SIZE": str(env.world_size),
        "LOCAL_WORLD_SIZE": str(env.local_world_size),
        "GROUP_RANK": str(env.node_rank),
        "NODE_RANK": str(env.node_rank),
        "MASTER_ADDR": str(env.master_addr or "127.0.0.1"),
    }
    if env.master_port:
        out["MASTER_PORT"] = str(env.master_port)
    if rewrite_slurm:
        out.update({name: str(getattr(env, field)) for name, field in _SLURM_FROM_WORLD})
        per_node = f"{env.local_world_size}(x{env.num_nodes})" if env.num_nodes > 1 else str(env.local_world_size)
        out["SLURM_TASKS_PER_NODE"] = out["SLURM_STEP_TASKS_PER_NODE"] = per_node
    return out


def export_world_env(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set :func:`world_env` in this worker (torchrun's agent or srun started it; else nothing)."""
    from trainscale.env import detect  # noqa: PLC0415 (job kit)

    env = detect(environ)
    if env.source not in ("torchrun", "slurm"):
        return
    environ.update(world_env(env, rewrite_slurm=env.source == "torchrun"))


def task_gpu(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """srun mode with TRAINSCALE_TASK_GPU=VAR: (VAR, this task's GPU) — the local rank's entry of the
    GPUs SLURM made visible (all of the node's when VAR is unset). None when not asked or not possible."""
    var = environ.get(TASK_GPU_VAR, "").strip()
    local = environ.get("SLURM_LOCALID")
    if not var or local is None or not local.isdigit():
        return None
    visible = [v for v in environ.get(var, "").split(",") if v.strip()]
    if not visible:
        return var, local
    if int(local) < len(visible):
        return var, visible[int(local)].strip()
    return None  # fewer GPUs than tasks on this node: leave them all visible (lint says so)


def narrow_gpu(environ: MutableMapping[str, str] = os.environ) -> None:
    chosen = task_gpu(environ)
    if chosen is not None:
        environ[chosen[0]] = chosen[1]


def apply_bind_from_env(environ: Mapping[str, str] = os.environ) -> None:
    """Bind this worker to its CPUs when the launcher handed down a plan (torchrun cannot bind)."""
    if not environ.get(BIND_VAR):
        return
    from trainscale.env import detect  # noqa: PLC0415 (job kit)
    from trainscale.topology import bind_worker  # noqa: PLC0415 (job kit)

    env = detect(environ)
    report = bind_worker(env.local_rank, env.local_world_size)
    if env.local_rank == 0 or report.far:
        print(f"trainscale: {report.describe()}", file=sys.stderr, flush=True)


def heed_stop_signals() -> None:
    """A launcher started with ``nohup`` or ``&`` from a script ignores SIGHUP (and SIGINT) and its workers
    inherit that; torch's agent, which answers those signals itself, passes the one it got on to the workers
    when it stops them, and ignoring it they would hold the stop up for its 30 s before a SIGKILL. A worker
    takes the interpreter's own default back (a script that sets its own handler later keeps it)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if signal.getsignal(signal.SIGHUP) is signal.SIG_IGN:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)


def set_error_file(environ: MutableMapping[str, str] = os.environ) -> None:
    """Point @record at ``<dir>/error-rank<R>.json`` so every srun task leaves its traceback in the job dir."""
    directory = environ.get(ERROR_DIR_VAR)
    if not directory or environ.get("TORCHELASTIC_ERROR_FILE"):
        return
    rank = environ.get("RANK") or environ.get("SLURM_PROCID") or environ.get("PMI_RANK") or "0"
    environ["TORCHELASTIC_ERROR_FILE"] = os.path.join(directory, f"error-rank{rank}.json")


USAGE = "usage: bootstrap (--script PATH | --module NAME | --exec PROGRAM) [ARGS...]"


def main(argv: list[str], *, forked: bool = False) -> None:
    """Run one worker. ``forked``: started by :func:`forked` (it returns after a clean run)."""
    set_error_file()  # first: record_error writes there if anything below fails (as @record would)
    heed_stop_signals()
    die_with_parent()
    faulthandler.enable(all_threads=True)  # a segfault still leaves Python stacks on stderr
    try:
        _main(argv)
    except SystemExit as exc:
        stop_observing()
        record_error(exc)  # nothing for a successful exit
        if succeeded(exc):
            return exit_cleanly(0, forked=forked)
        if isinstance(exc.code, int):  # sys.exit(3): 3 it is, whatever the teardown would do
            exit_cleanly(exc.code, release=False)
        if forked:  # sys.exit("message"): what the interpreter would do
            print(exc.code, file=sys.stderr, flush=True)
            exit_cleanly(1, release=False)
        raise  # the interpreter prints it and exits 1
    except BaseException as exc:
        explained = explain_hang(exc)  # a collective timeout: the hang watch's verdict is the cause
        exc = from_users_code(explained or exc)
        if explained is not None:
            record_error(exc, replace=True)
        record_error(exc)  # before the observation stops: the launcher may stop this rank once another fails
        stop_observing()
        if is_refusal(exc):  # a refusal that names its fix: one line, as before launch (error file: stack)
            print(f"trainscale: error: {one_line(exc)}", file=sys.stderr, flush=True)
            exit_cleanly(1, release=False)
        if os.environ.get(PREFIXED_VAR):  # the agent prefixes this rank's lines already, and shows what it tails
            sys.excepthook = _without_rank_prefix(sys.excepthook)
            if any(m in "".join(traceback.format_exception(exc)) for m in PEER_GONE):
                print(LOST_PEER, file=sys.stderr, flush=True)  # the console's summary names the rank that ended
        # what the interpreter would do (a timeout with the hang watch's verdict as its cause), from the user's
        # code on; torch's own @record must not overwrite the error file
        sys.excepthook(type(exc), exc, exc.__traceback__)
        if isinstance(exc, KeyboardInterrupt):
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        exit_cleanly(1, release=False)
    stop_observing()
    exit_cleanly(0, forked=forked)


LOST_PEER = "trainscale: this rank lost a rank that ended first; its traceback is kept out of the console:"
"""Said before the traceback of a rank that only lost a peer: `trainscale run`'s console shows nothing of
that rank's from here on (launch/agent.py), its log keeps it all, and the summary names the rank that ended."""

_OWN_FRAMES = (os.path.abspath(__file__), runpy.__file__, "<frozen runpy>")


def from_users_code(exc: BaseException) -> BaseException:
    """``exc`` (and the exceptions chained to it) with tracebacks that start at the user's code: this module's
    and runpy's frames, which every worker's traceback would begin with, dropped."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        tb = e.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename in _OWN_FRAMES:
            tb = tb.tb_next
        if tb is not None:  # an error in this module itself keeps its frames
            e.__traceback__ = tb
        todo += [e.__cause__, e.__context__]
    return exc


# The environment this module was imported with: in a forkserver's preload, the forkserver's (see forked).
_IMPORTED_WITH = dict(os.environ)
# What torch's agent sets for each worker (torch/distributed/elastic/agent/server/local_elastic_agent.py).
_AGENT_SETS = (
    "RANK",
    "LOCAL_RANK",
    "GROUP_RANK",
    "ROLE_RANK",
    "ROLE_NAME",
    "LOCAL_WORLD_SIZE",
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "OMP_NUM_THREADS",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
)


FORK_OWN_WORKERS = False
"""Set by trainscale's command line in its own process (cli/main.py): trainscale's own workers are then
forked from multiprocessing's forkserver, which trainscale sets up for them (launch/local.py). There is one
forkserver per process: in a library caller's process (a notebook's ``trainscale.launch(fn)``) it is the
caller's, so there they start as fresh interpreters, as a script's workers do."""

FORKSERVER_BLOCKS = (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
"""What the forkserver of trainscale's own workers keeps blocked: srun and a terminal signal every process
of the step or group, and the forkserver dying of one would take every worker with it (their parent)."""


@contextlib.contextmanager
def collector_paused():
    """Import torch with the garbage collector off. Its full collections while the heap grows by ~300,000
    objects that all live as long as the process are waste: 0.3 of the 2.3 CPU-s that importing torch and
    torch._dynamo takes. For trainscale's own processes (the forkserver, its own modules' fresh workers); a
    user's script imports torch exactly as it would under torchrun. (The launcher's import of torch alone
    gains 0.07 CPU-s from it: not worth a special case.)"""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


OWN_MODULE_IMPORTS = {"trainscale.workloads": ("torch", "torch._dynamo")}
"""What a fresh worker of trainscale's own module imports first, with the collector paused: torch, and for
a workload torch._dynamo too, which its optimizer's first step imports. Other own modules: torch."""


def forked(launcher: dict, *argv: str) -> None:
    """One worker of trainscale's own (a workload, allreduce, `launch(fn)`'s runner) as torch's agent
    starts a function: forked from a forkserver that imported torch once for the node (launch/local.py,
    docs/launch.md "Workers of trainscale's own"). It is then the worker :func:`main` would be.

    The forkserver may be older than this launch (a notebook launches again), so the worker takes the
    launcher's ``environ`` and ``cwd`` as they are now, then what the agent set for this rank; what a
    fresh interpreter started by the agent would have, it is given here: unbuffered output
    (PYTHONUNBUFFERED), the thread count (OMP_NUM_THREADS), a session of its own (a terminal's Ctrl-C
    reaches the launcher, which stops the workers), numpy's global generator seeded anew, and its name."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORKSERVER_BLOCKS)  # one sent meanwhile arrives now
    try:
        check_no_cuda_inherited(sys.modules.get("torch"), sys.modules.get("trainscale.launch.forkserver"))
        _leave_forkserver()
        die_with_launcher(launcher["environ"])
        os.setsid()
        own = {
            k: v
            for k, v in os.environ.items()
            if _IMPORTED_WITH.get(k) != v or k in _AGENT_SETS or k.startswith("TORCHELASTIC_")
        }
        os.environ.clear()
        os.environ.update({**launcher["environ"], **own})
        os.chdir(launcher["cwd"])
        if os.environ.get("PYTHONUNBUFFERED"):
            for name in ("stdout", "stderr"):
                stream = getattr(sys, name)
                setattr(
                    sys,
                    name,
                    io.TextIOWrapper(
                        io.FileIO(stream.fileno(), "w", closefd=False),
                        write_through=True,
                        encoding=stream.encoding,
                        errors=stream.errors,
                    ),
                )
        torch = sys.modules.get("torch")  # loaded by the forkserver, whose OpenMP read its own environment
        if torch is not None and os.environ.get("OMP_NUM_THREADS", "").isdigit():
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        numpy = sys.modules.get("numpy")  # torch's import seeded it in the server: every worker would draw alike
        if numpy is not None:
            numpy.random.seed()
        name_process(f"ts-rank{os.environ.get('RANK', '')}")
        main(list(argv), forked=True)
    except KeyboardInterrupt:  # outside the script (torch's wrapper would take it for a clean end): die of it
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


def check_no_cuda_inherited(torch, server: Any = None) -> None:
    """A forked worker whose forkserver had initialised CUDA cannot use a GPU (torch: "Cannot re-initialize
    CUDA in forked subprocess"). The forkserver imports torch and never touches a device; this holds it to
    that, in words, before the worker's code meets it in the middle of its model set-up: torch's own lazy
    initialisation (its bad-fork flag), and any library's ``cuInit`` (``server``: the forkserver's module, which
    asked the driver itself after its imports; its answer is inherited)."""
    bad_fork = getattr(getattr(torch, "cuda", None), "_is_in_bad_fork", None)
    if (bad_fork is not None and bad_fork()) or getattr(server, "CUDA_DRIVER_INITIALISED", False):
        raise RuntimeError(
            "trainscale: this worker was forked from a process that had initialised CUDA (the "
            "launcher's forkserver must not): its GPU is unusable here; a bug in trainscale, or "
            "a module the forkserver preloads touched the device"
        )


def cuda_driver_initialised() -> bool:
    """Whether some library of this process called the CUDA driver's ``cuInit``: without it ``cuDeviceGetCount``
    answers CUDA_ERROR_NOT_INITIALIZED (3) and initialises nothing. No driver loaded: none could have."""
    try:
        if "libcuda.so" not in Path("/proc/self/maps").read_text():
            return False
        count = ctypes.c_int()
        return ctypes.CDLL("libcuda.so.1").cuDeviceGetCount(ctypes.byref(count)) != 3
    except (OSError, AttributeError):
        return False


def die_with_launcher(environ: Mapping[str, str]) -> bool:
    """A forked worker's parent is the forkserver, which ends when the launcher does, and the worker with it
    (PR_SET_PDEATHSIG): a chain that waits for the forkserver to be scheduled, late on a starved node. So the
    worker also watches the launcher itself through a pidfd (Linux >= 5.3), in a thread that only waits: when the
    launcher's process ends, however (SIGKILL, the OOM killer), this one does too. True when watching."""
    pid, _, _ = environ.get(AGENT_VAR, "").partition(":")
    if not pid.isdigit() or not hasattr(os, "pidfd_open"):
        return False
    try:
        fd = os.pidfd_open(int(pid))
    except OSError:  # already gone: die_with_parent's checks end this worker
        return False

    def wait() -> None:
        import select  # noqa: PLC0415 (job kit)

        select.select([fd], [], [])  # readable once the process has ended
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=wait, name="trainscale-launcher-watch", daemon=True).start()
    return True


def _leave_forkserver() -> None:
    """Close this worker's copy of the launcher's end of the forkserver's lifeline (multiprocessing hands
    it to every forked child, so that the child could fork from the server too). The forkserver ends when
    no process holds it: with the workers' copies closed, when the launcher ends, even by SIGKILL, and
    the workers then die with the forkserver (:func:`die_with_parent`)."""
    from multiprocessing import forkserver  # noqa: PLC0415 (job kit)

    server = forkserver._forkserver  # type: ignore[attr-defined]
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is not None:
        with contextlib.suppress(OSError):
            os.close(fd)
        server._forkserver_alive_fd = None


def name_process(name: str) -> None:
    """The name ``ps``/``top`` show for this process (a forked worker's would be its forkserver's)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] not in ("--script", "--module", "--exec"):
        raise SystemExit(USAGE)
    kind, target, args = argv[0], argv[1], argv[2:]
    # Before the user's code reads them (torch reads *_VISIBLE_DEVICES when CUDA is first touched).
    export_world_env()
    narrow_gpu()
    apply_bind_from_env()
    if kind != "--exec":
        observe_when_torch_loads(kit=os.environ.get(KIT_VAR))
        stores_where_the_script_says()
    leave_kit()
    enter_snapshot()
    if kind == "--exec":  # a program, not Python (torchrun's --no-python): it inherits the world above
        sys.stdout.flush()
        os.execvp(target, [target, *args])
    sys.argv = [target, *args]
    if kind == "--module" and target.split(".")[0] == "trainscale":
        with collector_paused():
            for name in OWN_MODULE_IMPORTS.get(target, ("torch",)):
                importlib.import_module(name)
    if kind == "--module":
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")


AGENT_STORE_VAR = "TORCHELASTIC_USE_AGENT_STORE"


def stores_where_the_script_says(environ: Mapping[str, str] = os.environ) -> None:
    """torch's agent store (``TORCHELASTIC_USE_AGENT_STORE``: every rank a client of the store the launcher hosts
    at ``MASTER_PORT``) serves the ranks the launcher started, where they meet at its port. A script that meets
    elsewhere — its own ``MASTER_PORT``, ``init_method="tcp://host:port"``, its own ranks started by
    ``torch.multiprocessing.spawn`` as PyTorch's DDP tutorial does — would connect to a store no one hosts and wait
    there, silent, for the group's timeout (as under torchrun). There its rank 0 hosts the store, as under
    ``python script.py``: the rendezvous at another port, and the processes the script starts, go without it.
    Once torch is imported; the rank says once whether the processes it starts are observed."""
    if environ.get(AGENT_STORE_VAR) == "True" and environ.get("MASTER_PORT"):
        unobserved = (
            "unobserved (from the job kit, they have no trainscale to import)"
            if environ.get(KIT_VAR)
            else None
            if observing(environ)
            else "unobserved (the step records and the hang watch are off)"
        )
        when_imported("torch", lambda port=environ["MASTER_PORT"]: _own_stores(port, unobserved=unobserved))


def _own_stores(agent_port: str, *, unobserved: str | None) -> None:
    try:  # (torch.multiprocessing's ``spawn`` is the function; its module's ``start_processes`` is what it calls)
        tmp, spawning = sys.modules["torch.multiprocessing"], importlib.import_module("torch.multiprocessing.spawn")
        handlers = importlib.import_module("torch.distributed.rendezvous")._rendezvous_handlers
        start = spawning.start_processes
    except (KeyError, ImportError, AttributeError):  # another torch: as torchrun does
        return
    told = []

    def start_processes(fn, args=(), nprocs=1, *rest, **kwargs):
        if not told:
            told.append(nprocs)
            how = unobserved or "observed as the ranks of their own process group"
            print(
                f"trainscale: the script starts {nprocs} process(es) of its own (torch.multiprocessing), {how}",
                file=sys.stderr,
                flush=True,
            )
        if unobserved is None:
            from trainscale.launch.spawned import spawned_rank  # noqa: PLC0415 (not in the job kit)

            fn = functools.partial(spawned_rank, fn, nprocs)
        with _no_agent_store():  # (the children take the environment as it is while they start)
            return start(fn, args, nprocs, *rest, **kwargs)

    spawning.start_processes = tmp.start_processes = start_processes
    for scheme in ("env", "tcp"):
        if scheme in handlers:
            handlers[scheme] = _hosted_where_it_meets(handlers[scheme], scheme, agent_port)


def _hosted_where_it_meets(handler, scheme: str, agent_port: str):
    """torch's rendezvous ``handler`` (a generator of the store, rank and world size), without the agent store
    where the script meets at another port than the launcher's."""
    from urllib.parse import urlparse  # noqa: PLC0415 (job kit: once torch is loaded)

    def rendezvous(url, **kwargs):
        port = urlparse(url).port if scheme == "tcp" else os.environ.get("MASTER_PORT")
        if str(port) == agent_port:
            yield from handler(url, **kwargs)
            return
        with _no_agent_store():
            found = next(handler(url, **kwargs))
        yield found

    return rendezvous


@contextlib.contextmanager
def _no_agent_store():
    saved = os.environ.pop(AGENT_STORE_VAR, None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ[AGENT_STORE_VAR] = saved


def leave_kit(environ: MutableMapping[str, str] = os.environ) -> None:
    """Started from the job kit (a stock container): forget the kit's copy of trainscale before the
    user's code runs, so ``import trainscale`` there finds the image's own one (or fails by name)."""
    kit = environ.pop(KIT_VAR, None)
    if not kit:
        return
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != kit]
    for name, module in list(sys.modules.items()):
        if (name == "trainscale" or name.startswith("trainscale.")) and os.path.abspath(
            getattr(module, "__file__", None) or ""
        ).startswith(kit + os.sep):
            del sys.modules[name]


def enter_snapshot(environ: MutableMapping[str, str] = os.environ) -> None:
    """A submitted job runs a snapshot of its code: every import path inside the original directory (the
    working directory, PYTHONPATH, an editable install's path) is pointed at its copy where the copy has
    it, so the job imports the code as it was at submission, as ``trainscale run`` would have found it."""
    copy, root = environ.get(SNAPSHOT_VAR), environ.get(SNAPSHOT_OF_VAR)
    if not copy or not root:
        return

    def mapped(entry: str) -> str:
        path = os.path.abspath(entry or ".")
        if path == root or path.startswith(root + os.sep):
            candidate = copy + path[len(root) :]
            if os.path.exists(candidate):
                return candidate
        return entry

    sys.path[:] = [mapped(p) for p in sys.path]
    if environ.get("PYTHONPATH"):  # DataLoader workers and other children start from it
        environ["PYTHONPATH"] = os.pathsep.join(mapped(p) for p in environ["PYTHONPATH"].split(os.pathsep))


PR_SET_PDEATHSIG, PR_SET_NAME = 1, 15  # <linux/prctl.h>


def die_with_parent(environ: Mapping[str, str] = os.environ) -> bool:
    """A worker of torch's agent (``trainscale run``, torchrun) gets SIGKILL when the agent dies.

    Without it a SIGKILLed launcher (the OOM killer, ``kill -9``, a lost SSH session's cleanup) leaves
    its ranks training on and writing checkpoints with nobody watching. The kernel sends the signal
    when the thread that started this process ends: torch's agent starts and watches its workers
    from one thread for their whole life. A parent that died before ``prctl`` ran is caught by the
    checks after it (``trainscale run`` names its pid in TRAINSCALE_AGENT; the image's own
    torchrun in a stock container does not, and the parent pid read first covers the rest).
    srun tasks are left alone: their parent is slurmstepd, which ends them itself. A worker forked from
    trainscale's forkserver (:func:`forked`) has the forkserver as its parent, which ends with the agent.
    True when set.
    """
    if not environ.get("TORCHELASTIC_RUN_ID") or not sys.platform.startswith("linux"):
        return False
    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):  # no prctl here: nothing to set
        return False
    pid, _, run_id = environ.get(AGENT_VAR, "").partition(":")
    agent = int(pid) if pid.isdigit() and run_id == environ["TORCHELASTIC_RUN_ID"] else None
    if os.getppid() != parent or (agent is not None and not _alive(agent)):
        os.kill(os.getpid(), signal.SIGKILL)  # the agent is already gone: do not start training
    return True


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    return True


def _without_rank_prefix(hook):
    """``sys.excepthook`` without the ``[rankN]:`` prefix torch's ``init_process_group`` adds to
    tracebacks (torch wraps the hook it found, once per initialisation): where the agent prefixes the
    rank's lines itself, the traceback would read ``[rank0]: [rank0]: ...``. A hook of the user's own
    stays."""
    while getattr(hook, "__name__", "") == "_distributed_excepthook" and getattr(hook, "__closure__", None):
        cells = dict(zip(hook.__code__.co_freevars, hook.__closure__))
        if "old_hook" not in cells:
            break
        hook = cells["old_hook"].cell_contents
    return hook


EXIT_VAR = "TRAINSCALE_EXIT"
"""``full``: a successful worker ends through the C library's ``exit`` (see :func:`exit_cleanly`)."""


def exit_cleanly(status: int, *, release: bool = True, forked: bool = False) -> None:
    """After the user's code returned (or chose its exit status with ``sys.exit(N)``): end this
    worker with that status, as the script meant.

    With torch 2.13 and gloo, a process whose process group is still alive when the interpreter tears
    down aborts in about a third of runs (SIGABRT: a gloo thread needs the GIL of an interpreter that is
    finalizing; docs/launch.md, "How a run ends"). So this does what a normal exit does that a user may
    rely on, in the interpreter's own order (threads joined, ``atexit`` handlers, after success the
    process groups released, stdio flushed: a failing flush exits 120), then leaves with ``os._exit``.
    A script that raised or crashed is not ended here: it keeps its own exit code or signal.

    ``os._exit`` skips what C code registered with ``atexit()`` and C++ destructors: where a profiler
    (Nsight Systems, rocprof, Darshan) flushes its trace there, ``TRAINSCALE_EXIT=full`` ends a successful
    worker through the C library's ``exit`` instead (after the same steps; the Python interpreter is still
    not torn down, which is what aborted).
    """
    threading._shutdown()  # type: ignore[attr-defined]  # CPython's own, since 3.0
    atexit._run_exitfuncs()
    if release:
        release_process_groups()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream
            status = status or 120
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).fflush(None)  # what C and C++ code printed through stdio
    if status == 0 and os.environ.get(EXIT_VAR) == "full":
        ctypes.CDLL(None).exit(0)  # C atexit handlers and destructors run; returns never
    if forked and status == 0:
        return  # torch's agent waits for the function to return; its process ends with os._exit too
    os._exit(status)


def release_process_groups() -> None:
    """After a clean run, let torch.distributed wind down while the interpreter is still whole.

    A full collection frees models in reference cycles, so a destroyed group can really go (joining
    its gloo threads); a group the script left initialised is destroyed (NCCL communicators are
    freed in order rather than by the process's end). Not done after an error: destroying a group
    whose peers are gone can wait out the collective timeout.
    """
    gc.collect()
    dist = sys.modules.get("torch.distributed")  # never import torch just for this
    if dist is not None and dist.is_available() and dist.is_initialized():
        groups = list(dist.distributed_c10d._world.pg_map)  # the last references, dropped with the GIL released
        dist.destroy_process_group()  # (a model's Reducer dropping them would hold it: docs/launch.md)
        gc.collect()
        del groups


if __name__ == "__main__":
    main(sys.argv[1:])
