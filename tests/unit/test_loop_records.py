"""Step records (observe/steps.py's clock, observe/hooks.py's recorder) and what the training loop adds
(train/observing.py): step phases, exposed communication, FLOPs counted without touching the run, the network
check, and the switch."""

from __future__ import annotations

import types

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from trainscale.errors import ConfigError
from trainscale.observe import hooks
from trainscale.observe.steps import StepMarks
from trainscale.train.observing import check_network, recorder_for, step_flops

NCCL = __import__("pathlib").Path(__file__).resolve().parents[1] / "fixtures" / "nccl"


def test_step_marks_add_repeated_phases_and_need_no_device_sync():
    marks = StepMarks(torch.device("cpu"))
    clock = iter([0.0, 0.1, 0.3, 0.6, 0.7, 0.8, 1.0, 1.3, 1.32, 1.35, 1.4])  # two micro-batches, then clipping
    marks._now = lambda: next(clock)
    marks.start_step()
    for phase in (
        "data",
        "forward",
        "backward",
        "optimizer",
        "data",
        "forward",
        "backward",
        "sync",
        "other",
        "optimizer",
    ):
        marks.mark(phase)
    marks.end_step({"step": 1, "samples": 32}, carry=True)
    (record,) = marks.ready()
    assert record["step"] == 1 and record["samples"] == 32
    assert record["step_s"] == pytest.approx(1.4) and record["comm_s"] == pytest.approx(0.02)
    assert record["data_s"] == pytest.approx(0.1 + 0.1) and record["compute_s"] == pytest.approx(0.2 + 0.2)
    assert record["backward_s"] == pytest.approx(0.3 + 0.3) and record["optimizer_s"] == pytest.approx(0.1 + 0.05)
    assert marks.ready() == []
    assert marks._marks == [("start", 1.4)]  # carried: the next step starts where this one ended


def test_a_wait_for_a_collective_inside_a_phase_is_communication_not_the_phases():
    """FSDP's all-gathers in forward: a rank that waits there for a late rank did not compute then; its wait
    goes to ``comm_s`` (the late rank is the one that waits least), the phase keeps the rest."""
    marks = StepMarks(torch.device("cpu"))
    clock = iter([0.0, 0.1, 0.5, 0.6, 0.7, 0.9, 1.0])
    marks._now = lambda: next(clock)
    marks.start_step()
    marks.mark("data")
    marks.waited(0.3)  # an all-gather in forward
    marks.mark("forward")
    marks.mark("between")
    marks.mark("backward")
    marks.waited(0.15)  # a reduce-scatter at backward's end, before the sync mark
    marks.mark("sync")
    marks.waited(0.05)  # ZeRO's broadcast in the optimizer step
    marks.mark("optimizer")
    marks.end_step({"step": 1})
    (record,) = marks.ready()
    assert record["compute_s"] == pytest.approx(0.1) and record["optimizer_s"] == pytest.approx(0.05)
    assert record["comm_s"] == pytest.approx(0.3 + 0.2 + 0.05) and record["step_s"] == pytest.approx(1.0)


def test_a_wait_after_the_optimizers_step_is_the_next_steps_communication():
    """DeepSpeed's ZeRO all-gathers the updated parameters after its optimizer's step (a script may all-reduce its
    loss there): a rank that waits there for a late rank's optimizer step waited, it did not wait for its data."""
    marks = StepMarks(torch.device("cpu"))
    clock = iter([0.0, 0.1, 0.2, 0.3, 0.4, 0.9, 1.0])
    marks._now = lambda: next(clock)
    marks.start_step()
    for phase in ("data", "forward", "backward", "optimizer"):
        marks.mark(phase)
    marks.waited(0.45)  # the all-gather after the step, before the next forward
    marks.end_step({"step": 1}, carry=True)
    marks.mark("data")
    marks.mark("forward")
    marks.end_step({"step": 2})
    first, second = marks.ready()
    assert first["comm_s"] == 0.0 and second["comm_s"] == pytest.approx(0.45)
    assert second["data_s"] == pytest.approx(0.05) and second["step_s"] == pytest.approx(0.6)


def test_the_recorder_times_a_collectives_wait_on_the_main_thread_only(monkeypatch):
    """Every blocking collective waits in ``Work.wait``: the recorder times it there, on its main thread."""
    work = torch.distributed.distributed_c10d.Work
    recorder = hooks.Recorder("unused")
    recorder.active, recorder.marks = True, StepMarks(torch.device("cpu"))
    recorder.marks.start_step()
    waits = []
    recorder.marks.waited = waits.append
    monkeypatch.setattr(work, "wait", lambda self, *a, **k: True)
    undo = hooks._time_waits(recorder)
    try:
        assert work.wait(object()) is True and len(waits) == 1 and waits[0] >= 0
        import threading

        thread = threading.Thread(target=work.wait, args=(object(),))
        thread.start()
        thread.join()
        assert len(waits) == 1  # another thread's wait (a checkpoint writer's, say) is not the step's
    finally:
        undo()
    work.wait(object())
    assert len(waits) == 1


def test_no_event_is_recorded_or_queried_while_the_script_captures_a_cuda_graph(monkeypatch):
    """issue 47 N9: a mark inside the user's CUDA-graph capture recorded a CUDA event into the user's graph (and
    querying one fails a capture). Here the capture is torch's own flag, faked; the events are stand-ins."""

    class Event:
        def __init__(self, t):
            self.t = t

        def query(self):
            return True

        def synchronize(self):
            pass

        def elapsed_time(self, other):
            return (other.t - self.t) * 1000.0

    clock = iter(range(100))
    capturing = [True]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    marks = StepMarks(torch.device("cuda", 0))
    marks._now = lambda: Event(next(clock))
    marks.start_step()
    marks.mark("forward")
    assert marks._marks == [] and marks.ready(flush=True) == []  # nothing recorded during the capture
    capturing[0] = False
    for phase in ("data", "forward", "backward"):
        marks.mark(phase)
    capturing[0] = True
    marks.mark("optimizer")  # the captured optimizer step: its time runs on into the next mark
    marks.end_step({"step": 1})
    assert marks.ready(flush=True) == []  # not even queried while capturing
    capturing[0] = False
    (record,) = marks.ready(flush=True)
    assert record["step_s"] == 3.0 and record["optimizer_s"] == 0.0 and record["backward_s"] == 1.0


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(64, 32)
        self.bn = nn.BatchNorm1d(32)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(self.bn(self.fc(x)))


def _loss(model, batch):
    return model(batch[0].to("cpu")).pow(2).mean()


def test_step_flops_leave_the_run_untouched_and_match_torchs_count():
    torch.manual_seed(0)
    model, batch = Net(), (torch.randn(8, 64),)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    rng = torch.random.get_rng_state()
    flops = step_flops(model, Net, _loss, batch, micro_batches=2)
    assert torch.equal(rng, torch.random.get_rng_state())  # dropout drew from a forked generator
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # BN statistics restored
    assert all(p.grad is None for p in model.parameters())
    with FlopCounterMode(display=False) as forward, torch.no_grad():
        _loss(Net(), batch)
    assert flops == 2 * 3 * forward.get_total_flops()  # per micro-batch: forward + backward as twice the forward

    # a sharded module's parameters are not plain: a fake-tensor copy built from the task is counted exactly
    # (here the first layer needs no input gradient, so backward is one matmul, not two)
    with FlopCounterMode(display=False) as exact:
        _loss(Net(), batch).backward()
    model.fc.weight.ds_id = 0
    assert step_flops(model, Net, _loss, batch) == exact.get_total_flops() == 2 * forward.get_total_flops()
    assert step_flops(model, Net, lambda m, b: m(b[0]).sum().item(), batch) is None  # reads a value: not countable
    # issue 39 defect 4: a batch on the rank's GPU (here the meta device stands for it) met a copy built on the
    # CPU and nothing was counted: FSDP and ZeRO-3 runs had no FLOPs or MFU on GPUs
    on_device = (torch.empty(8, 64, device="meta"),)
    assert (
        step_flops(model, Net, lambda m, b: m(b[0]).pow(2).mean(), on_device, device="meta") == exact.get_total_flops()
    )
    # issue 47 D4: the workloads' loss (workloads/classify.py) moves a loader's CPU batch to the rank's GPU, where
    # a copy built on the CPU did not follow: cnn/mlp under fsdp or ZeRO-3 on a GPU had no FLOPs or MFU
    moved = step_flops(
        model, Net, lambda m, b: m(b[0].to("meta", non_blocking=True)).pow(2).mean(), batch, device="meta"
    )
    assert moved == exact.get_total_flops()


def test_a_sharded_modules_compute_dtype_is_its_mixed_precision_not_its_fp32_shards(tmp_path):
    """issue 39 defect 4: FSDP keeps fp32 shards and computes in bf16; against the fp32 peak, MFU read ~15x high."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from trainscale.observe.models import param_dtype

    assert param_dtype(Net()) == torch.float32
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = Net()
        fully_shard(
            model, mesh=init_device_mesh("cpu", (1,)), mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16)
        )
        assert next(model.parameters()).dtype == torch.float32 and param_dtype(model) == torch.bfloat16
    finally:
        dist.destroy_process_group()


def _rt(**kw):
    env = types.SimpleNamespace(run_dir=kw.pop("run_dir", None))
    base = dict(
        env=env,
        device=torch.device("cpu"),
        rank=0,
        local_rank=0,
        world_size=2,
        is_main=True,
        backend="nccl",
        num_nodes=2,
    )
    return types.SimpleNamespace(**{**base, **kw})


def test_records_need_a_run_directory_and_can_be_switched_off(tmp_path):
    assert recorder_for(_rt(), environ={}) is None
    assert recorder_for(_rt(run_dir=str(tmp_path)), environ={"TRAINSCALE_RECORD": "0"}) is None
    recorder = recorder_for(_rt(run_dir=str(tmp_path)), environ={})
    try:
        assert recorder is not None and recorder.active and hooks.current() is recorder
        assert recorder_for(_rt(run_dir=str(tmp_path / "other")), environ={}) is recorder  # one per process
    finally:
        recorder.finish()
    assert not recorder.active and recorder.finish() is None  # no step seen: nothing written
    assert not (tmp_path / "metrics").exists()


@pytest.mark.parametrize(
    "log, required, outcome",
    [
        ("lumi-ofi-2nodes.log", False, "ok"),
        ("lumi-socket-fallback.log", False, "warning"),
        ("lumi-socket-fallback.log", True, "error"),
    ],
)
def test_the_network_check_after_the_first_step(tmp_path, capsys, log, required, outcome):
    environ = {
        "TRAINSCALE_INTERCONNECT": "ofi",
        "NCCL_DEBUG_FILE": str(NCCL / log),
        "TRAINSCALE_INTERCONNECT_REQUIRED": "1" if required else "0",
    }
    if outcome == "error":
        with pytest.raises(ConfigError, match="not the cluster's fast network"):
            check_network(_rt(), str(tmp_path), environ)
    else:
        check_network(_rt(), str(tmp_path), environ)
    said = capsys.readouterr().err
    assert ("trainscale: network:" in said) == (outcome != "ok")
    assert f'"level":"{outcome}"' in (tmp_path / "metrics" / "events.jsonl").read_text()
    # gloo ranks, one node or no profile expectation: nothing to check
    check_network(_rt(backend="gloo"), str(tmp_path / "g"), environ)
    check_network(_rt(num_nodes=1), str(tmp_path / "one"), environ)
    assert not (tmp_path / "g").exists() and not (tmp_path / "one").exists()


class Normalize(nn.Module):
    """A torchvision-style transform: an nn.Module without parameters, called on each sample."""

    def forward(self, x):
        return (x - 0.5) / 0.25


class Samples(torch.utils.data.Dataset):
    def __init__(self) -> None:
        self.transform, self.x = Normalize(), torch.rand(32, 64)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.transform(self.x[i])  # with gradients on, in the training process (num_workers=0)


def test_the_lead_module_is_the_model_not_a_transform_the_loader_calls_first(tmp_path):
    """issue 47 N4: the first top-level module called with gradients on became the recorder's lead, its device
    the step clock's: transforms in a num_workers=0 DataLoader won, so a GPU run was timed on the host, and
    the samples and FLOPs counted were those of one sample through Normalize."""
    from trainscale.observe.records import read_run

    torch.manual_seed(0)
    model = nn.Linear(64, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    recorder = hooks.Recorder(tmp_path, environ={}).install()
    try:
        for (x,) in zip(torch.utils.data.DataLoader(Samples(), batch_size=8, num_workers=0)):
            nn.functional.mse_loss(model(x), torch.zeros(8, 32)).backward()  # the loss is a module too
            opt.step()
            opt.zero_grad()
        summary = recorder.finish()
    finally:
        recorder.uninstall()
    assert recorder._lead() is model
    assert summary["flops_per_step"] == 3 * 2 * 8 * 64 * 32  # the model's forward and backward on a batch of 8
    steps = [r for r in read_run(tmp_path)["ranks"][0] if r["kind"] == "step"]
    assert [r["samples"] for r in steps] == [8, 8, 8, 8]


def test_a_rank_started_by_mpirun_records_under_its_own_rank_before_any_process_group(tmp_path):
    """issue 45: the recorder read RANK/LOCAL_RANK (or SLURM's) itself, so every rank mpirun started wrote
    rank-0.jsonl as local rank 0 (each sampling the node) until a process group existed; it asks env.detect()."""
    from trainscale.observe.records import read_run

    environ = {
        "OMPI_COMM_WORLD_RANK": "1",
        "OMPI_COMM_WORLD_SIZE": "2",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder = hooks.Recorder(tmp_path, environ=environ).install()
    try:
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
        recorder.finish()
    finally:
        recorder.uninstall()
    meta = read_run(tmp_path)["ranks"][1][0]
    assert (meta["kind"], meta["rank"], meta["world_size"]) == ("meta", 1, 2)
    assert recorder.sampler is None  # local rank 1: the node is sampled by its local rank 0


class _TrainsInTheWorker(torch.utils.data.Dataset):
    """A loader whose worker trains a small model of its own per item (a learned augmentation, say)."""

    def __init__(self) -> None:
        self.net = nn.Linear(4, 4)
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)

    def __len__(self):
        return 8

    def __getitem__(self, i):
        for _ in range(3):  # steps enough that a live recorder copy would end one and open its record file
            self.net(torch.randn(2, 4)).sum().backward()
            self.opt.step()
        return torch.randn(4)


def test_a_forked_loader_worker_records_nothing_of_its_own(tmp_path):
    """The hooks ask no getpid per call: the recorder's copy in a forked DataLoader worker is switched off at the
    fork, so the worker's own training writes no record into the rank's file."""
    import os

    from trainscale.observe.records import read_run

    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    recorder = hooks.Recorder(tmp_path, environ={}).install()
    try:
        loader = torch.utils.data.DataLoader(
            _TrainsInTheWorker(), batch_size=2, num_workers=1, multiprocessing_context="fork"
        )
        for x in loader:
            model(x).sum().backward()
            opt.step()
            opt.zero_grad()
        recorder.finish()
    finally:
        recorder.uninstall()
    records = read_run(tmp_path)["ranks"][0]
    assert [r["pid"] for r in records if r["kind"] == "meta"] == [os.getpid()]
    assert [r["step"] for r in records if r["kind"] == "step"] == [1, 2, 3, 4]


def test_after_its_first_steps_only_the_models_top_level_module_is_observed_and_a_later_model_is_found(tmp_path):
    """issue 46 item 7: a global module hook puts every module call on torch's slow path (a few µs each, the
    recorder's largest cost on a model of many small modules). The global hooks find the top-level modules in
    the first steps, then those are observed through torch's per-instance call, with no hook; a model built later
    is found when its optimizer steps twice unseen, and recorded from then on. A deep copy (an EMA model) or a
    pickle (``torch.save(model)``) of an observed model works and carries nothing of the recorder's."""
    import copy
    import io

    from torch.nn.modules import module as nn_module

    from trainscale.observe.records import read_run

    def train(model, opt, steps, batch):
        for _ in range(steps):
            model(torch.ones(batch, 4)).sum().backward()
            opt.step()
            opt.zero_grad()

    first = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    later = nn.Sequential(nn.Linear(4, 2), nn.Linear(2, 1))

    def ours(hooks_: dict) -> list:  # another test's recorder in this worker process may hold hooks of its own
        return [h for h in hooks_.values() if getattr(h, "__self__", None) is recorder]

    def observed(module) -> bool:
        return module.__dict__.get("_compiled_call_impl") is not None

    recorder = hooks.Recorder(tmp_path, environ={}).install()
    globals_installed = len(ours(nn_module._global_forward_pre_hooks)), len(ours(nn_module._global_forward_hooks))
    try:
        train(first, torch.optim.SGD(first.parameters(), lr=0.01), 4, batch=2)
        assert not ours(nn_module._global_forward_pre_hooks) and not ours(nn_module._global_forward_hooks)
        assert observed(first) and not first._forward_pre_hooks and not first._forward_hooks
        assert not observed(first[0]) and not first[0]._forward_pre_hooks  # its layers: torch's fast path
        ema = copy.deepcopy(first)
        with torch.no_grad():
            assert not observed(ema) and torch.equal(ema(torch.ones(1, 4)), first(torch.ones(1, 4)))
        torch.save(first, io.BytesIO())
        train(later, torch.optim.SGD(later.parameters(), lr=0.01), 6, batch=3)
        recorder.finish()
    finally:
        recorder.uninstall()
    assert globals_installed == (1, 1)
    assert not observed(first) and not observed(later)  # all undone
    steps = [r for r in read_run(tmp_path)["ranks"][0] if r["kind"] == "step"]
    samples = [r.get("samples") for r in steps]
    assert samples[:4] == [2, 2, 2, 2]  # the first model's steps, each one
    assert samples[-3:] == [3, 3, 3]  # the later model's, once found
    assert recorder.step == len(steps) < 10  # its first steps, unseen, are no step of their own


def test_an_observed_model_the_script_drops_is_freed_and_its_forward_error_goes_on(tmp_path):
    """The recorder holds an observed top-level module weakly (a model the script replaces frees its memory, a
    GPU's too); an error in the model's forward reaches the script as it is, and the next forward is recorded."""
    import gc
    import weakref

    class Flaky(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer, self.fail = nn.Linear(4, 1), False

        def forward(self, x):
            if self.fail:
                raise ValueError("the script's own error")
            return self.layer(x)

    recorder = hooks.Recorder(tmp_path, environ={}).install()
    try:
        model = Flaky()
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(5):
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
        assert model.__dict__.get("_compiled_call_impl") is not None  # observed by itself now
        model.fail = True
        with pytest.raises(ValueError, match="the script's own error"):
            model(torch.ones(2, 4))
        model.fail = False
        before = recorder._micro
        model(torch.ones(2, 4)).sum().backward()
        assert recorder._micro == before + 1  # counted again: the failed call left no depth behind
        dropped = weakref.ref(model)
        del model, opt
        gc.collect()
        assert dropped() is None
    finally:
        recorder.uninstall()


def test_a_forward_that_fails_in_the_first_steps_leaves_the_next_steps_recorded(tmp_path, recwarn):
    """While the global hooks find the model (its first steps), torch calls an ``always_call`` global hook after a
    failed forward as ``hook(module, args, None)``, without the keyword arguments it asked for: the recorder's end
    of a forward takes that call too, at each level the error passes, so the failed call leaves no depth behind and
    the steps after it are recorded (and torch warns of no hook that failed)."""
    from trainscale.observe.records import read_run

    class Inner(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer, self.fail = nn.Linear(4, 4), False

        def forward(self, x):
            if self.fail:
                raise ValueError("a bad batch")
            return self.layer(x)

    model = nn.Sequential(nn.Linear(4, 4), Inner(), nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    recorder = hooks.Recorder(tmp_path, environ={}).install()
    try:
        for step in range(10):
            model[1].fail = step == 1  # in the finding steps, two levels deep
            try:
                model(torch.ones(2, 4)).sum().backward()
            except ValueError:
                continue
            opt.step()
            opt.zero_grad()
        assert recorder._finding == []  # the model was found and is observed by itself
        recorder.finish()
    finally:
        recorder.uninstall()
    steps = [r for r in read_run(tmp_path)["ranks"][0] if r["kind"] == "step"]
    assert [r.get("samples") for r in steps][-6:] == [2] * 6
    assert len(steps) >= 8
    assert not [w for w in recwarn if "always_call" in str(w.message)]


@pytest.mark.parametrize("grouped", [False, True])
def test_backward_is_timed_from_its_call_with_no_hook_registered_each_forward(tmp_path, grouped):
    """issue 46 item 7: a node's pre-hook on each forward's output cost 10-20 µs a micro-batch. Backward's start
    is its call (``torch.autograd.backward``, which ``Tensor.backward`` calls); alone, its end is its return; on
    grouped ranks a lasting hook on the model's first trainable parameter queues backward's end before DDP's
    wait, and the sync mark after it. A model whose first parameter gets no gradient falls back to a hook on each
    forward's output, and still splits backward from the wait: so do a model whose first parameter's gradient
    comes in reentrant checkpointing's own backward (inside the step's) and a loop that calls
    ``torch.autograd.grad`` and sets its gradients itself. A compiled model (``torch.compile``'s module refuses
    ``bool()``) is hooked as any other."""

    class Unused(nn.Module):  # its first parameter is in no graph: the lasting hook never fires
        def __init__(self) -> None:
            super().__init__()
            self.spare, self.layer = nn.Parameter(torch.ones(1)), nn.Linear(4, 1)

        def forward(self, x):
            return self.layer(x)

    class Checkpointed(nn.Module):  # its first parameter's gradient comes in reentrant checkpointing's own backward
        def __init__(self) -> None:
            super().__init__()
            self.inner, self.first, self.last = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 1)

        def forward(self, x):
            from torch.utils.checkpoint import checkpoint

            return self.last(checkpoint(self.inner, self.first(x), use_reentrant=True))

    class ByGrad(nn.Sequential):  # a loop that sets its gradients itself (torch.autograd.grad): nothing accumulates
        pass

    environ = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"} if grouped else {}
    environ = {**environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"} if grouped else environ
    original = torch.autograd.backward, torch.autograd.grad
    recorder = hooks.Recorder(tmp_path, environ=environ).install()
    reached = []  # the calls of a hook on a forward's output
    recorder._node_reached = lambda grad, reached_=recorder._node_reached: reached.append(1) or reached_(grad)
    try:
        compiled = torch.compile(nn.Linear(4, 1), backend="eager")  # refuses bool(): len() of a Linear
        models = (nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1)), compiled, Unused(), Checkpointed())
        for model in (*models, ByGrad(nn.Linear(4, 1))):
            opt = torch.optim.SGD(model.parameters(), lr=0.01)
            phases: list[list[str]] = []
            for _ in range(8):  # a model after the first is found when its optimizer steps twice unseen
                model(torch.ones(2, 4))  # a forward with no backward (an evaluation's with grad on) is no step
                loss = model(torch.ones(2, 4)).sum()
                marked = len(recorder.marks._marks)
                if isinstance(model, ByGrad):
                    for param, grad in zip(model.parameters(), torch.autograd.grad(loss, list(model.parameters()))):
                        param.grad = grad
                else:
                    loss.backward()
                opt.step()
                phases.append([phase for phase, _ in recorder.marks._marks[marked:]])
                opt.zero_grad()
            want = ["between", "backward", *(["sync"] if grouped else []), "other", "optimizer"]
            assert phases[-1] == want, (type(model).__name__, phases)
            fell_back = grouped and isinstance(model, (Unused, Checkpointed, ByGrad))
            assert recorder._per_forward == fell_back
            assert bool(reached) == fell_back  # a hook on each forward's output only where no parameter's fires
            reached.clear()
    finally:
        recorder.uninstall()
    assert (torch.autograd.backward, torch.autograd.grad) == original  # undone


def test_a_gradient_penalty_by_autograd_grad_before_backward_leaves_the_backward_timed(tmp_path):
    """A review's case: ``torch.autograd.grad`` after the forward (a gradient penalty, a physics loss), then
    ``loss.backward()``: the grad call took the step's one backward slot, and the real backward's time went to
    "other". Both are backward now, and the time between them the loss's."""
    original = torch.autograd.backward, torch.autograd.grad
    recorder = hooks.Recorder(tmp_path, environ={}).install()
    try:
        model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(4):
            x = torch.ones(2, 4, requires_grad=True)
            out = model(x)
            marked = len(recorder.marks._marks)
            (dx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
            (out.sum() + dx.pow(2).sum()).backward()
            opt.step()
            seen = [phase for phase, _ in recorder.marks._marks[marked:]]
            opt.zero_grad()
        assert seen == ["between", "backward", "between", "backward", "other", "optimizer"], seen
    finally:
        recorder.uninstall()
    assert (torch.autograd.backward, torch.autograd.grad) == original


def _gan_loop():
    torch.manual_seed(0)
    gen, disc = nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4)), nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 1))
    g_opt, d_opt = torch.optim.SGD(gen.parameters(), lr=0.01), torch.optim.SGD(disc.parameters(), lr=0.01)

    def step():
        fake = gen(torch.randn(3, 4))
        (disc(torch.randn(3, 4)).mean() - disc(fake.detach()).mean()).backward()
        d_opt.step()
        d_opt.zero_grad()
        disc(fake).mean().backward()
        g_opt.step()
        g_opt.zero_grad()

    return step


def _nanogpt_loop():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    batch = [torch.randint(0, 16, (4, 6))]

    def step():
        for _ in range(2):  # forward, the next batch fetched, backward
            loss = model(batch[0]).logsumexp(-1).mean() / 2
            batch[0] = torch.randint(0, 16, (4, 6))
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        with torch.no_grad():  # an evaluation's forward between steps
            model(batch[0])

    return step


def _penalty_loop():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        x = torch.randn(5, 4, requires_grad=True)
        out = model(x)
        (dx,) = torch.autograd.grad(out.sum(), x, create_graph=True)
        (out.sum() + dx.pow(2).sum()).backward()
        opt.step()
        opt.zero_grad()

    return step


def _keyword_loop():
    class ByKeyword(nn.Module):  # HF's models take ``input_ids=``; this one fails now and then, and the loop goes on
        def __init__(self) -> None:
            super().__init__()
            self.embed, self.head, self.calls = nn.Embedding(16, 8), nn.Linear(8, 1), 0

        def forward(self, input_ids):
            self.calls += 1
            if self.calls % 5 == 0:
                raise ValueError("a bad batch")
            return self.head(self.embed(input_ids)).mean()

    torch.manual_seed(0)
    model = ByKeyword()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        try:
            model(input_ids=torch.randint(0, 16, (3, 5))).backward()
        except ValueError:
            return
        opt.step()
        opt.zero_grad()

    return step


GROUPED = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
GROUPED["MASTER_PORT"] = "29500"


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("loop", [_gan_loop, _nanogpt_loop, _penalty_loop, _keyword_loop])
def test_the_short_path_of_the_steady_state_records_what_the_long_path_does(tmp_path, monkeypatch, loop, grouped):
    """issue 46 item 7: once the top-level modules are known, their calls, backward and the optimizer's marks take a
    short path that appends the marks itself (a third of the Python the long path ran each step). The same loop
    recorded by the long path alone gives the same phases in the same order, and the same samples, tokens and
    micro-batches, step by step: a GAN's two optimizers, nanoGPT's fetch between forward and backward with an
    evaluation under ``no_grad``, a gradient penalty by ``torch.autograd.grad`` before backward, a model called by
    keyword that fails now and then; alone, and on a rank of a group (backward's end from a parameter's hook, the
    wait at the collective apart)."""
    ended: list[tuple] = []
    end_step = StepMarks.end_step

    def noted(marks, fields, **kwargs):
        ended.append(
            (tuple(phase for phase, _ in marks._marks), fields["samples"], fields["tokens"], fields["micro_batches"])
        )
        end_step(marks, fields, **kwargs)

    monkeypatch.setattr(StepMarks, "end_step", noted)
    long_calls = []  # the top-level modules' calls with grad on, once they are known, that took the long path
    forward_pre = hooks.Recorder._forward_pre

    def long_path(recorder, module, args):
        if not recorder._finding and not recorder._depth and torch.is_grad_enabled():
            long_calls.append(module)
        forward_pre(recorder, module, args)

    monkeypatch.setattr(hooks.Recorder, "_forward_pre", long_path)

    def recorded(short: bool) -> tuple[list[tuple], int]:
        ended.clear()
        long_calls.clear()
        recorder = hooks.Recorder(tmp_path / str(short), environ=GROUPED if grouped else {}).install()
        if not short:
            recorder._refresh_fast = lambda: setattr(recorder, "_fast", False)
        try:
            step = loop()
            for _ in range(12):
                step()
            recorder.finish()
        finally:
            recorder.uninstall()
        return list(ended), len(long_calls)

    (short, by_short), (long, by_long) = recorded(True), recorded(False)
    assert by_short == 0 < by_long  # the steady state's calls took the short path, and only there
    assert len(short) >= 8 and short == long
