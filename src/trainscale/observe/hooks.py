"""The one recorder: what every rank trainscale starts records about its training steps, with no change to
the script — a user's plain DDP loop, an HF ``Trainer``, a DeepSpeed engine, or a built-in workload alike.

The worker bootstrap installs it when the script imports torch (observe/worker.py), if the run has a
directory (``TRAINSCALE_RUN_DIR``) and ``TRAINSCALE_RECORD`` is not ``0``. It sees the steps through what
torch exposes to anyone:

- torch's global optimizer step hooks: a step is an optimizer step (DeepSpeed's engine and HF's
  ``Trainer`` step a torch optimizer inside; a step that skips it, an fp16 overflow, is no step);
- the top-level modules' calls (a module called while no other is running): their forward passes, and the
  batch they got (samples, tokens). torch's global module hooks find them, during the first
  ``SETTLE_STEPS + 1`` steps only: a global hook puts every module call of the model on torch's slow path (a few
  µs each), so once the top-level modules are known their calls are observed by themselves (:func:`_observe`)
  and the global hooks go. An optimizer stepping twice with no forward seen (a model built later) turns the
  global hooks on again;
- ``torch.autograd.backward`` and ``torch.autograd.grad`` (``Tensor.backward`` calls the first): backward's
  start, and alone its end; on ranks of a group, the autograd engine's end-of-backward callback, queued from a
  lasting hook on the model's first trainable parameter (or, where that one does not fire, from a hook on each
  forward's output): it runs before DDP's own (which waits for the last gradient all-reduce), and queues
  itself again to run after it, so that backward's computing and its wait at the collective are timed apart:
  who arrives last at the collective is who waits least there (observe/stragglers.py);
- the DataLoader's iterator (``__next__``): the time a step spends fetching its batches, and that there is one;
- a collective's ``Work.wait()`` on the main thread (every blocking collective of ``torch.distributed`` waits
  there, FSDP2's all-gathers and reduce-scatters and ZeRO's broadcasts too): its time is communication, taken
  out of the phase it fell in (observe/steps.py), so a rank that waits in its forward for a late rank's
  all-gather is not taken for one that computed there.

The phases go through one clock (observe/steps.py) into ``metrics/rank-<R>.jsonl`` in the records' format
(observe/records.py), so ``trainscale report``, the straggler watch and the studies read a script's run
as they read a workload's. Each step also tells the rank's heartbeat (runtime/hangwatch/heartbeat.py), which names
a hung rank. Hooks never change a tensor: training is bitwise the same with and without them. What it
costs: ``benchmarks/record_overhead.py``; the fields: docs/observability.md.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import statistics
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from trainscale.env import detect, node_name
from trainscale.observe.models import (
    autocast_dtype,
    batch_size,
    device_of,
    param_dtype,
    strategy_of,
    tensors,
    unit_bytes,
    unwrap,
)
from trainscale.observe.steps import StepMarks
from trainscale.observe.worker import recording_on

_ENGINE = torch.autograd.Variable._execution_engine
_current: Recorder | None = None
_lock = threading.Lock()
FLUSH_EVERY_S = 0.5
"""How often the flushing thread turns the finished steps into records (lines, the straggler watch's window)."""
SETTLE_STEPS = 2
"""Steps counted with the global module hooks before the one at whose end the top-level modules are observed by
themselves: the global hooks see the first ``SETTLE_STEPS + 1`` steps."""
PEAK_EVERY_S = 0.1
"""How often, at a step's end, the rank's peak memory is read (on a CPU a system call: not every tiny step)."""
_compiler: Any = (
    torch.compiler if hasattr(torch.compiler, "_is_compiling_flag") else types.SimpleNamespace(_is_compiling_flag=False)
)
"""Its ``_is_compiling_flag``: what torch sets while it compiles or exports (where this torch has one)."""
_tracing: Callable[[], bool] = getattr(torch.compiler, "is_dynamo_compiling", lambda: False)
"""True while dynamo traces the code that calls it (dynamo folds it), else False: one call, where
``torch.compiler.is_compiling`` makes two (see :func:`_compiling`)."""


def current() -> Recorder | None:
    """This process's recorder, if one is installed."""
    return _current


def install(run_dir: str | Path | None, *, environ: Any = os.environ) -> Recorder | None:
    """The process's recorder, installed now if it is not (None without a run directory or when switched off)."""
    global _current
    with _lock:
        if _current is not None and _current.active:
            return _current
        if not run_dir or not recording_on(environ):
            return None
        _current = Recorder(run_dir, environ=environ).install()
        return _current


class Recorder:
    """The hooks and what they feed: the step clock, this rank's record file, and on rank 0 the straggler watch."""

    __slots__ = (
        "__dict__",
        "__weakref__",
        *("active", "marks", "state", "step", "_append", "_backward_armed", "_clock", "_depth"),
        *("_end_param", "_end_queued", "_fast", "_finding", "_forwarded", "_grouped", "_in_backward", "_lead"),
        *("_micro", "_nested", "_note_step", "_per_forward", "_samples", "_stepped", "_timed", "_tokens", "_unseen"),
    )
    """The attributes the hooks read each step, in slots: past 30 attributes an instance's dictionary is no longer
    shared with its class's, and each of the others is a dictionary lookup (a third slower)."""

    def __init__(self, run_dir: str | Path, *, environ: Any = os.environ) -> None:
        self.run_dir, self.environ = str(run_dir), environ
        self.active = False
        # a forked DataLoader worker inherits the hooks: it records nothing (no getpid per hook call)
        os.register_at_fork(after_in_child=functools.partial(_forked, weakref.ref(self)))
        self.step = 0
        self.marks: StepMarks | None = None
        self.out: Any = None  # observe/records.RankRecorder, from the first step
        self.sampler = self.watch = self.place = None
        self.meta: dict[str, Any] = {}
        self.count_flops: Callable[[], int | None] | None = None
        """A counter of one step's FLOPs, called at the end (the training loop's: it counts sharded models too);
        without one, the lead module's forward on its first batch is counted once at the second step's start."""
        self.flops_per_step: int | None = None
        self.step_times: list[float] = []
        self.steps_peak = 0
        """The rank's peak memory at the end of its last completed step (read at most every ``PEAK_EVERY_S``):
        the training steps' (what ``plan`` predicts), before an evaluation or the end of the run raises the
        whole run's."""
        self._peak_at = float("-inf")
        self.summary: dict[str, Any] | None = None
        self._depth = 0
        self._timed = False  # the top-level forward running now is timed (its start passed the checks its end needs)
        self._fast = False
        """The steady state (:meth:`_refresh_fast`): the top-level modules known, the steps timed on the host by the
        clock and list bound below, no calibration: their calls and backward take the short path."""
        self._append: Callable[[tuple[str, float]], None] = list().append
        self._clock: Callable[[], float] = time.perf_counter
        self._lead: Any = None  # weakref to the first top-level module with parameters: its batches count
        self._first_batch: tuple | None = None
        self._stepped = False  # an optimizer stepped since the last forward: the step ends at the next forward
        self._forwarded = False
        self._samples = self._tokens = 0
        self._micro = self._micro_last = 0  # the lead module's forwards in this step and in the last (micro-batches)
        self._loader: list[float] | None = None  # DataLoader time of this step and the next's, once one is seen
        self._runq = _run_queue()  # the main thread's time waiting for a CPU so far (None: no /proc)
        self._backward_armed = False  # a top-level forward ended: the next ``torch.autograd.backward`` is its
        self._in_backward = self._end_queued = False
        self._nested = 0  # backward calls running inside the step's (reentrant checkpointing's)
        self._per_forward = False  # backward's end found by a hook on each forward's output (no parameter's fires)
        self._end_param: Any = None  # the handle of the hook on the lead model's parameter (grouped ranks)
        self._grouped = False
        self._autocast: torch.dtype | None = None
        self._handles: list[Any] = []
        self._finding: list[Any] = []  # the global module hooks, while the top-level modules are looked for
        self._found_from = 0  # the step they were put on at
        self._rooted: list[Callable[[], None]] = []  # what undoes the observing of the top-level modules found
        self._roots: weakref.WeakSet = weakref.WeakSet()
        self._unseen: set[int] = set()  # the optimizers that stepped since the last forward a hook saw
        self._params: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        """Whether a top-level module has parameters, asked once (``parameters()`` costs microseconds)."""
        self._ready: collections.deque[dict[str, Any]] = collections.deque()
        """Finished steps with their times, waiting for the flushing thread (a GPU's, read on the training thread)."""
        self._lock = threading.Lock()  # one writer of the records at a time: the flushing thread, the end, a stall
        self._stop = threading.Event()
        self._flusher: threading.Thread | None = None
        self._note_step: Callable[[int], None] = lambda step: None
        self._cuda = torch.backends.cuda.is_built()  # a CPU build never times on a GPU: not asked every forward
        from trainscale.observe.state import PLAN_STEPS_VAR, StateCount  # noqa: PLC0415 (job kit)

        self.plan_steps = int(_float(environ, PLAN_STEPS_VAR, 0))
        """``trainscale plan``'s calibration: count the state, stop after this many steps (0: a normal run)."""
        self.state = StateCount() if self.plan_steps > 0 else None

    # -- installing -------------------------------------------------------------------------------
    def install(self) -> Recorder:
        from torch.optim import optimizer as optim  # noqa: PLC0415 (job kit)

        self._handles = [
            optim.register_optimizer_step_pre_hook(self._optimizer_pre),
            optim.register_optimizer_step_post_hook(self._optimizer_post),
            _time_loader(self),
            _time_waits(self),
            _time_backward(self),
        ]
        from trainscale.runtime.hangwatch import heartbeat  # noqa: PLC0415 (job kit)

        self._note_step = heartbeat.note_step  # each step tells the rank's heartbeat
        self._find_roots()
        self.active = True
        return self

    def uninstall(self) -> None:
        self._unhook_parameter()
        for handle in self._handles + self._finding + self._rooted:
            handle() if callable(handle) else handle.remove()
        self._handles, self._finding, self._rooted, self.active = [], [], [], False
        self._refresh_fast()

    def _find_roots(self) -> None:
        """Every module call through the global hooks, until the top-level modules are known (``_settle``)."""
        from torch.nn.modules import module as nn_module  # noqa: PLC0415 (job kit)

        for undo in self._rooted:
            undo()
        self._rooted, self._found_from = [], self.step
        self._unseen.clear()
        self._finding = [
            nn_module.register_module_forward_pre_hook(self._forward_pre),
            nn_module.register_module_forward_hook(self._forward_post, with_kwargs=True, always_call=True),
        ]
        self._refresh_fast()

    def _settle(self) -> None:
        """The top-level modules found are observed by themselves (:func:`_observe`) and the global hooks go: the
        model's inner calls leave torch's slow path."""
        for handle in self._finding:
            handle.remove()
        self._finding = []
        self._rooted = [_observe(root, self) for root in list(self._roots)]
        self._refresh_fast()

    def _refresh_fast(self) -> None:
        """Whether the hot path may be short: the steps timed on the host's clock, the top-level modules observed by
        themselves, a lead module known, no calibration counting the state (and, for a module's call, checked there:
        CUDA not initialized, where the long path looks for a model on a GPU). The
        short path (:func:`_observe`, :func:`_time_backward`, the optimizer hooks) appends the marks itself and does
        what the long one does in the steady state; every other case takes the long one."""
        marks = self.marks
        self._fast = bool(
            self.active
            and self._rooted  # (found and settled: the global hooks are gone)
            and marks is not None
            and not marks.events
            and self._lead is not None
            and self.state is None
        )
        if self._fast:
            self._append, self._clock = marks._marks.append, marks._now

    def _ours(self) -> bool:
        return self.active and not _compiling()

    # -- the hooks ----------------------------------------------------------------------------------
    def _forward_pre(self, module: torch.nn.Module, args: tuple) -> None:
        if self._depth:  # a module inside a top-level one: every call of a model's layers comes here
            self._depth += 1
            return
        if self._in_backward:  # reentrant checkpointing's forward again, inside backward: no step's forward
            return
        if self._finding:  # every module's call: the top-level ones with parameters are the model's
            has_params = self._params.get(module)
            if has_params is None:
                has_params = self._params[module] = next(module.parameters(), None) is not None
            if not has_params:  # a transform (Normalize, RandomCrop), a loss: no model, no step of its own
                return
            self._roots.add(module)
        self._depth = 1
        if not torch.is_grad_enabled() or not self.active or _compiling():
            return
        self._timed = True
        if self._unseen:
            self._unseen.clear()
        # the device's model is looked for only while the steps are timed on the host and CUDA is in use
        gpu = None
        if self._cuda and (self.marks is None or not self.marks.events) and torch.cuda.is_initialized():
            gpu = next(module.parameters()).device
            gpu = gpu if gpu.type == "cuda" else None
        if self.marks is None or gpu is not None:
            # the first model with parameters, or the first on a GPU after one on the host: its device times
            # the steps, and it becomes the lead (its batches are the samples, its FLOPs the step's)
            self.marks = StepMarks(gpu or device_of(module, args))
            self._lead = self._first_batch = None
            self._unhook_parameter()
            self._refresh_fast()
            self._samples = self._tokens = 0
            self._grouped = _place(self.environ)[1] > 1  # alone, no collective to wait for: no communication
        if self._stepped:  # the previous step ended with its last optimizer step
            self._end_step()
            if self.flops_per_step is None:
                self._maybe_count_flops()
        self.marks.mark("data")
        if self.state is not None:
            self.state.forward_started()

    def _forward_post(self, module: torch.nn.Module, args: tuple, kwargs: Any, output: Any = None) -> None:
        # (after a failed forward torch calls an always_call global hook as ``hook(module, args, None)``, with no
        # keyword arguments whatever it was registered with: the same end, or the failed call left its depth behind)
        if type(kwargs) is not dict:
            kwargs = {}
        if not self._depth:  # a top-level module without parameters (its forward_pre did not count it)
            return
        self._depth = depth = self._depth - 1
        if depth or not self._timed:  # an inner module's end, or a forward its start left untimed
            return
        self._timed = False
        self.marks.mark("forward")
        self._forwarded = True
        if self._lead is None:
            self._lead = weakref.ref(module)
            self._autocast = autocast_dtype(self.marks.device)
        if self._lead() is module:
            samples, tokens = batch_size(args, kwargs)
            self._samples += samples or 0
            self._tokens += tokens or 0
            self._micro += 1
            if self.state is not None:
                self.state.forward_ended(samples)
            if self._first_batch is None and self.step == 0:
                self._first_batch = (args, kwargs)
        self._backward_armed = True
        if self._per_forward:
            self._hook_output(output)

    def _hook_output(self, output: Any) -> None:
        """No parameter's hook fired (FSDP2's sharded ones, an unused one): backward's end from the output's."""
        for tensor in (output,) if type(output) is torch.Tensor else tensors(output):
            if tensor.requires_grad and (node := tensor.grad_fn) is not None:
                node.register_prehook(self._node_reached)  # autograd keeps no hook across graphs

    def _backward_started(self) -> None:
        """``torch.autograd.backward`` was called after a forward (:func:`_time_backward`)."""
        self._backward_armed = False
        if self.marks is None or not self.active:
            return
        self.marks.mark("between")  # forward's end to backward's start: the loss, a batch fetched there
        self._end_queued = False
        self._in_backward = True
        if self._grouped and not self._per_forward and self._end_param is None:
            self._hook_a_parameter()

    def _backward_returned(self, grad: bool = False) -> None:
        """``grad``: it was ``torch.autograd.grad`` (a gradient penalty, a physics loss, or a loop that sets its
        gradients itself): a ``backward`` after it in the same step is timed too."""
        self._in_backward = False
        if grad:
            self._backward_armed = True
        if self._end_queued or self.marks is None or not self.active:
            return
        self.marks.mark("backward")  # alone: backward's end; grouped, no hook fired: its wait is in it this once
        if self._grouped and not self._per_forward:  # a hook on each forward's output from now on
            if self._end_param is not None:
                self._end_param.remove()
                self._end_param = None
            self._per_forward = True

    def _hook_a_parameter(self) -> None:
        """A lasting hook on the lead model's first trainable parameter: each backward that accumulates its
        gradient queues the end of backward's computing (:meth:`_queue_end`). One hook for the run, where a
        node's pre-hook has to be registered on every forward's output (10-20 us a micro-batch on CPU)."""
        lead = self._lead() if self._lead is not None else None  # (a compiled module refuses ``bool()``)
        try:
            param = next((p for p in lead.parameters() if p.requires_grad and p.is_leaf), None)
            self._end_param = param.register_post_accumulate_grad_hook(self._queue_end) if param is not None else None
        except Exception:  # no lead (the module was freed), a parameter torch refuses a hook: the fallback
            self._end_param = None
        self._per_forward = self._end_param is None

    def _unhook_parameter(self) -> None:
        if self._end_param is not None:
            self._end_param.remove()
        self._end_param, self._per_forward = None, False

    def _node_reached(self, grad: Any) -> None:
        self._queue_end()

    def _queue_end(self, *args: Any) -> None:
        # queued before DDP's (which waits for the gradient all-reduces: it is queued when the last bucket is
        # ready, after this gradient's hook): its first run ends backward's computing; queued again from there,
        # it runs after DDP's wait
        if self._in_backward and not self._end_queued and not self._nested:  # a nested backward's ends first
            self._end_queued = True
            _ENGINE.queue_callback(self._backward_ended)

    def _backward_ended(self) -> None:
        if self.marks is not None and self.active:
            self.marks.mark("backward")
            if self._grouped:  # alone, there is no collective to wait for: no sync mark, no communication
                _ENGINE.queue_callback(self._synced)

    def _synced(self) -> None:
        if self.marks is not None and self.active:
            self.marks.mark("sync")

    @contextlib.contextmanager
    def blocking_collective(self) -> Iterator[None]:
        """A collective that holds backward up while it runs (a blocking communication hook: ``comm_hook=shm``):
        its time is the step's exposed communication, as DDP's end-of-backward wait is."""
        timed = self.marks is not None and self._ours()
        if timed:
            self.marks.mark("backward")
        yield
        if timed:
            self.marks.mark("sync")

    def _loader_time(self, seconds: float) -> None:
        """A DataLoader's ``__next__`` took ``seconds``: this step's, or the next one's after the optimizer step."""
        if self.active:
            self._loader = self._loader or [0.0, 0.0]
            self._loader[1 if self._stepped else 0] += seconds

    def _optimizer_pre(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        if self.marks is None or not self._forwarded or not self.active or _tracing() or _compiler._is_compiling_flag:
            return  # (_compiling(), inline: a call less)
        if self._fast:  # the mark appended (_refresh_fast)
            self._append(("other", self._clock()))
        else:
            self.marks.mark("other")
        if self.state is not None:
            self.state.before_step(optimizer)

    def _optimizer_post(self, optimizer: Any, args: tuple, kwargs: dict) -> None:
        if not self.active or _tracing() or _compiler._is_compiling_flag:  # (_compiling(), inline: a call less)
            return
        if self._depth:  # a step inside a forward: the hooks stay as they are
            pass
        elif self._finding:
            if self.step >= self._found_from + SETTLE_STEPS and self._roots:
                self._settle()
        elif id(optimizer) in self._unseen:  # it stepped twice with no forward seen: a model not found yet
            self._find_roots()
            self._lead = None  # the model found next is the one training now: its batches count
            self._unhook_parameter()
        else:
            self._unseen.add(id(optimizer))
        if self.marks is None or not self._forwarded:
            return
        if self._fast:
            self._append(("optimizer", self._clock()))
        else:
            self.marks.mark("optimizer")
        if not self._stepped:
            self._stepped = True
            self.step += 1
            self._note_step(self.step)
        if self.state is not None:
            self.state.after_step(optimizer)
            if self.step > self.plan_steps:  # the calibration has its steps: the state, then the end
                self._calibrated()

    def _note_peak(self) -> None:
        from trainscale.runtime.memory import peak_memory  # noqa: PLC0415 (job kit)

        self.steps_peak = peak_memory(self.marks.device)[0]  # a running maximum: the latest is the largest
        self._peak_at = time.perf_counter()

    def _calibrated(self) -> None:
        self._note_peak()
        self.finish()  # it writes the state record
        raise SystemExit(0)

    # -- steps ------------------------------------------------------------------------------------
    def _end_step(self) -> None:
        """The training thread's part of a step's record: its marks and fields queued (the flushing thread
        makes the record: no JSON, no file, no lock here)."""
        if time.perf_counter() - self._peak_at >= PEAK_EVERY_S:
            self._note_peak()
        self._stepped = self._forwarded = self._backward_armed = False
        self.marks.end_step(self._fields(), carry=True)
        self._samples = self._tokens = 0
        self._micro_last, self._micro = self._micro, 0
        if self._loader:
            self._loader = [self._loader[1], 0.0]
        if self.out is None:
            self._open()
        if self.marks.events:  # a GPU's events are read on the training thread only (never during a capture)
            self._ready.extend(self.marks.ready())

    def _fields(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "t": time.time(),
            "samples": self._samples or None,
            "tokens": self._tokens or None,
            "micro_batches": self._micro or None,
            "loader_s": self._loader[0] if self._loader else None,
        }

    def _drain(self, *, read_events: bool = False) -> None:
        """The finished steps into the record file and the straggler watch's window. ``read_events``: on the
        training thread (at an epoch, the end), a GPU's steps too, waited for."""
        with self._lock:
            if self.marks is not None and (read_events or not self.marks.events):
                self._ready.extend(self.marks.ready(flush=read_events))
            if self._ready and self.out is None:
                self._open()
            runq, self._runq = self._runq, _run_queue()  # once a drain, not per step: a system call
            wait = (self._runq - runq) / len(self._ready) if self._ready and None not in (runq, self._runq) else None
            while self._ready:
                record = self._ready.popleft()
                record["cpu_wait_s"] = wait  # the drained steps' share of the main thread's wait for a CPU
                step, step_s = record.pop("step"), record.pop("step_s")
                self.step_times.append(step_s)
                self.out.step(step, step_s, **record)

    def _flushing(self) -> None:
        while not self._stop.wait(FLUSH_EVERY_S):
            try:
                self._drain()
            except Exception as exc:  # a record that cannot be written: the steps go on unrecorded
                print(f"trainscale: step records stopped: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
                return

    def _open(self) -> None:
        """This rank's record file, its flushing thread, its device sampler (local rank 0) and straggler watch
        (rank 0)."""
        from trainscale.observe.records import RankRecorder  # noqa: PLC0415 (job kit)
        from trainscale.observe.sampler import start_sampler  # noqa: PLC0415 (job kit)

        rank, world, local_rank, local_world, backend = _place(self.environ)
        lead = self._lead() if self._lead is not None else None
        device = self.marks.device if self.marks is not None else torch.device("cpu")
        script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
        meta = {
            "script": script if script and script != "__main__.py" else None,
            "strategy": strategy_of(lead) if lead is not None else None,
            "unit_bytes": unit_bytes(lead) if lead is not None else None,
            **self.meta,
        }
        self.out = RankRecorder(
            self.run_dir,
            rank,
            world_size=world,
            device=str(device),
            backend=backend,
            threads=torch.get_num_threads(),
            **meta,
        )
        self._flusher = threading.Thread(target=self._flushing, name="trainscale-records", daemon=True)
        self._flusher.start()
        try:
            from trainscale.observe.devices import publish  # noqa: PLC0415 (optional dependency)

            publish(self.run_dir, node_name(), rank, device)
            self.sampler = start_sampler(
                self.run_dir, local_rank=local_rank, local_ranks=local_world, environ=self.environ
            )
        except ImportError:  # psutil is not in a stock image: the steps are recorded, the node is not sampled
            self.sampler = None
        except Exception as exc:  # a driver hiccup: the records still go on
            print(f"trainscale: device sampling off: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        every = _float(self.environ, "TRAINSCALE_STRAGGLER_EVERY", 10.0)
        if rank == 0 and world > 1 and every > 0:
            from trainscale.observe.stragglers import StragglerWatch  # noqa: PLC0415 (job kit)

            say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
            try:
                self.watch = StragglerWatch(self.run_dir, say=say, every_s=every).start()
            except Exception:  # no store to read: the report still names a straggler from the files
                self.watch = None
        if world > 1:  # waits for the watch's flag; samples the stack only then (observe/place.py)
            from trainscale.observe.place import StackSampler  # noqa: PLC0415 (job kit)

            self.place = StackSampler(self, rank).start()

    def _maybe_count_flops(self) -> None:
        """At the second step's start (outside the optimizer's step), once: its time is not the step's."""
        if self.flops_per_step is not None or self.step != 1 or self.count_flops is not None:
            return
        try:
            counted = self._plain_flops()
        except Exception:  # counting is a nicety: a model it cannot count still trains
            counted = None
        self.flops_per_step = counted or 0
        self._first_batch = None
        self.marks.start_step()  # the count is no part of the next step

    def _plain_flops(self) -> int | None:
        lead = self._lead() if self._lead is not None else None
        if lead is None or self._first_batch is None:
            return None
        from trainscale.observe.flops import plain_step_flops  # noqa: PLC0415 (job kit)

        args, kwargs = self._first_batch
        return plain_step_flops(unwrap(lead), lambda model: model(*args, **kwargs), max(1, self._micro_last))

    # -- what the training loop adds ------------------------------------------------------------------
    def epoch(self, epoch: int, **fields: Any) -> None:
        """An epoch record (the built-in loop's): the steps it finished go first."""
        self._drain(read_events=True)
        if self.out is not None:
            self.out.epoch(epoch, **fields)

    def discard_step(self) -> None:
        """What the hooks saw since the last step was no training step (a resumed run's warm-up pass)."""
        if self.marks is not None:
            self.marks.start_step()
        self._forwarded = self._backward_armed = False
        self._samples = self._tokens = self._micro = 0

    def flush(self) -> None:
        """The steps so far to disk (the heartbeat's, from its thread, when progress stalls)."""
        if self.out is not None:
            self._drain()
            self.out.out.flush()

    def hang_noticed(self, verdict: Any) -> None:
        """The heartbeat's notice (rank 0): into the run's events, for the report; the steps so far to disk."""
        from trainscale.observe.records import note_event  # noqa: PLC0415 (job kit)

        note_event(self.run_dir, **verdict.event())
        self.flush()

    # -- the end ----------------------------------------------------------------------------------------
    def finish(self) -> dict[str, Any] | None:
        """The last steps, the summary (FLOPs, MFU, peak memory), threads stopped, hooks
        removed. Once; returns the summary (None when no step was recorded)."""
        if not self.active:
            return self.summary
        self.uninstall()
        self._stop.set()
        if self._flusher is not None:
            self._flusher.join()
        if self.marks is None:
            return None
        if self._stepped:
            self.marks.end_step(self._fields())
        self._drain(read_events=True)
        if self.out is None:
            return None
        if self.state is not None and self.state.params:  # a calibration that ended sooner than its steps too
            self.out.out.write(self.state.record())
        if self.count_flops is not None and not self.flops_per_step:
            self.flops_per_step = self.count_flops()
        from trainscale.runtime.memory import peak_memory  # noqa: PLC0415 (job kit)

        device = self.marks.device
        summary: dict[str, Any] = {
            "steps_recorded": len(self.step_times),
            "peak_mem_bytes": peak_memory(device)[0],
            "steps_peak_mem_bytes": self.steps_peak or None,
            "micro_batches": self._micro_last or None,
        }
        if device.type == "cuda":  # the caching allocator's own peak: what plan's fit allows beyond the allocations
            summary["reserved_peak_bytes"] = int(torch.cuda.max_memory_reserved(device))
        lead = self._lead() if self._lead is not None else None
        if self.flops_per_step:
            from trainscale.observe.flops import mfu, peak_for  # noqa: PLC0415 (job kit)

            median = statistics.median(self.step_times) if self.step_times else None
            dtype = self._autocast or param_dtype(lead)
            peak = peak_for(device, dtype, getattr(self.flops_per_step, "conv_share", 0.0))
            summary.update(
                flops_per_step=self.flops_per_step,
                step_median_s=median,
                flops_dtype=str(dtype),
                peak_flops=peak.flops if peak else None,
                peak_source=peak.source if peak else None,
                mfu=mfu(self.flops_per_step, median, peak.flops) if peak and median else None,
            )
        if self.watch is not None:
            self.watch.check()
            self.watch.stop()
        if self.place is not None:
            self.place.stop()
        if self.sampler is not None:
            self.sampler.sample()
            self.sampler.stop()
        self.out.summary(**summary)
        self.out.close()
        self.summary = summary
        return summary


def _observe(root: torch.nn.Module, recorder: Recorder) -> Callable[[], None]:
    """Each call of ``root`` between the recorder's forward marks; returns what undoes it. Through torch's own
    per-instance call (``_compiled_call_impl``, which ``Module.compile`` sets; wrapped when set): the module stays on
    torch's fast path when it has no hooks, its hooks (FSDP's) run inside the marks as they did inside the global
    hooks, and a ``copy.deepcopy``, ``copy.copy`` or ``torch.save`` of it drops the call (``Module.__getstate__``):
    an EMA copy, a pickled model carry nothing of trainscale's. The module is held weakly: a model the script drops
    is freed. (``nn.DataParallel``'s replicas copy a module's ``__dict__`` as it is: a model observed at the top
    level and only later wrapped in ``DataParallel`` would run as itself on every device.)"""
    ref = weakref.ref(root)
    previous = root.__dict__.get("_compiled_call_impl")
    pre, post, r = recorder._forward_pre, recorder._forward_post, recorder
    grad_enabled, tensor, cuda = torch.is_grad_enabled, torch.Tensor, torch.cuda

    def observed(*args: Any, **kwargs: Any) -> Any:
        module = ref()
        call = previous if previous is not None else module._call_impl
        if (
            not r._fast
            or r._depth
            or r._in_backward
            or not grad_enabled()
            or _tracing()
            or _compiler._is_compiling_flag
            or cuda._initialized  # (torch.cuda.is_initialized(), inline) the long path looks for a model on a GPU
        ):
            pre(module, args)  # the long path: what the global hooks did
            try:
                output = call(*args, **kwargs)
            except BaseException:
                with contextlib.suppress(Exception):  # the forward's own error goes on, as torch's always_call do
                    post(module, args, kwargs, None)
                raise
            post(module, args, kwargs, output)
            return output
        # the short path, a few times a step: _forward_pre's and _forward_post's steady state, inline
        r._depth = 1  # (before the step's end, as in the long path: a forward there is nested)
        if r._unseen:
            r._unseen.clear()
        if r._stepped:  # the step ended with its last optimizer step
            r._end_step()
            if r.flops_per_step is None:
                r._maybe_count_flops()
        append, clock = r._append, r._clock
        append(("data", clock()))
        try:
            output = call(*args, **kwargs) if kwargs else call(*args)  # (no empty dictionary made to pass on)
        except BaseException:
            r._timed = True
            with contextlib.suppress(Exception):
                post(module, args, kwargs, None)
            raise
        r._depth = 0
        append(("forward", clock()))
        r._forwarded = r._backward_armed = True
        if r._lead() is module:
            first = args[0] if args else None
            if type(first) is tensor and not kwargs:  # mostly ``model(x)``: models.batch_size's first case, inline
                shape = first.shape
                if shape:
                    r._samples += shape[0]
                    if len(shape) == 2 and not first.is_floating_point():
                        r._tokens += shape[0] * shape[1]
            else:
                samples, tokens = batch_size(args, kwargs)
                r._samples += samples or 0
                r._tokens += tokens or 0
            r._micro += 1
        if r._per_forward:
            r._hook_output(output)
        return output

    root._compiled_call_impl = observed

    def undo() -> None:
        if (module := ref()) is not None and module.__dict__.get("_compiled_call_impl") is observed:
            module._compiled_call_impl = previous

    return undo


def _compiling() -> bool:
    """Inside torch.compile's tracing (or torch.export's) the hooks do nothing (a side effect there is a graph
    break): asked in the module and optimizer hooks, which a compiled function can trace. The hooks called each
    step ask it inline."""
    return _tracing() or _compiler._is_compiling_flag


def _float(environ: Any, name: str, default: float) -> float:
    try:
        return float(environ.get(name, default))
    except (TypeError, ValueError):
        return default


def _time_loader(recorder: Recorder) -> Callable[[], None]:
    """Every DataLoader iterator's ``__next__`` timed for ``recorder`` (a forked worker's is not: not its pid);
    returns what undoes it. torch exposes no hook there, so the one method is wrapped."""
    from torch.utils.data import dataloader  # noqa: PLC0415 (job kit)

    original = dataloader._BaseDataLoaderIter.__next__

    @functools.wraps(original)
    def timed(iterator: Any) -> Any:
        started = time.perf_counter()
        try:
            return original(iterator)
        finally:
            recorder._loader_time(time.perf_counter() - started)

    dataloader._BaseDataLoaderIter.__next__ = timed
    return lambda: setattr(dataloader._BaseDataLoaderIter, "__next__", original)


def _time_backward(recorder: Recorder) -> Callable[[], None]:
    """Every ``torch.autograd.backward`` (which ``Tensor.backward`` calls: DDP, DeepSpeed, Accelerate and AMP's
    scaler all come through it) and ``torch.autograd.grad`` (a loop that sets its gradients itself) after a
    top-level forward, outside any forward, timed for ``recorder``: its start and, alone, its end. Returns what
    undoes it. torch has no lasting hook at backward's start: a node's pre-hook on each forward's output cost
    10-20 us a micro-batch on CPU, registered and called; this costs about 2."""
    originals = {name: getattr(torch.autograd, name) for name in ("backward", "grad")}

    def timed(original: Callable[..., Any], grad: bool) -> Callable[..., Any]:
        @functools.wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            if recorder._in_backward:  # one inside another (reentrant checkpointing): its hooks are not the step's
                recorder._nested += 1
                try:
                    return original(*args, **kwargs)
                finally:
                    recorder._nested -= 1
            if not recorder._backward_armed or recorder._depth:  # no forward before it, or inside a forward
                return original(*args, **kwargs)
            if not recorder._fast:
                recorder._backward_started()
                try:
                    return original(*args, **kwargs)
                finally:
                    recorder._backward_returned(grad)
            # the short path: _backward_started's and _backward_returned's steady state, inline
            recorder._backward_armed = recorder._end_queued = False
            recorder._append(("between", recorder._clock()))
            recorder._in_backward = True
            if recorder._grouped and not recorder._per_forward and recorder._end_param is None:
                recorder._hook_a_parameter()
            try:
                return original(*args, **kwargs)
            finally:
                recorder._in_backward = False
                if grad:
                    recorder._backward_armed = True
                if not recorder._end_queued:
                    if recorder._grouped and not recorder._per_forward:
                        recorder._backward_returned(grad)  # no hook fired: the long path switches to the outputs'
                    else:
                        recorder._append(("backward", recorder._clock()))

        return call

    for name, original in originals.items():
        setattr(torch.autograd, name, timed(original, name == "grad"))
    return lambda: [setattr(torch.autograd, name, original) for name, original in originals.items()]


def _run_queue() -> float | None:
    """Seconds the main thread has waited, ready to run, for a CPU another process held (Linux's schedstat): the
    evidence that other work shares a rank's cores. None where the kernel does not say. Read by whichever thread
    drains the records: the main thread's own file."""
    try:
        with open(f"/proc/self/task/{threading.main_thread().native_id}/schedstat") as fh:
            return int(fh.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def _time_waits(recorder: Recorder) -> Callable[[], None]:
    """Every wait for a collective on the main thread timed for ``recorder``; returns what undoes it. torch
    exposes no hook there either: the one method is wrapped (a C++ collective waited in C++, DDP's gradient
    all-reduce, is timed by backward's end instead)."""
    work = torch.distributed.distributed_c10d.Work if torch.distributed.is_available() else None
    if work is None:
        return lambda: None
    original, main = work.wait, threading.main_thread()

    @functools.wraps(original)
    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not main or recorder.marks is None or not recorder._ours():
            return original(self, *args, **kwargs)
        started = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            recorder.marks.waited(time.perf_counter() - started)

    work.wait = timed
    return lambda: setattr(work, "wait", original)


def _place(environ: Any) -> tuple[int, int, int, int, str | None]:
    """(rank, world size, local rank, local world size, backend): the process group's where there is one."""
    env, dist = detect(environ), torch.distributed
    rank, world, backend = env.rank, env.world_size, None
    if dist.is_available() and dist.is_initialized():
        rank, world, backend = dist.get_rank(), dist.get_world_size(), str(dist.get_backend())
    return rank, world, env.local_rank, env.local_world_size, backend


def _forked(recorder: weakref.ref) -> None:
    """In a forked child (a DataLoader's worker): its copy of the recorder records nothing."""
    if (copy := recorder()) is not None:
        copy.active = copy._fast = False
