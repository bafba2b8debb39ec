"""What the training loop records about itself, when the run has a directory (``TRAINSCALE_RUN_DIR``;
``TRAINSCALE_RECORD=0`` turns it off): every rank's step records, timed by the loop's one clock
(train/timing.StepClock), DDP's own timing per epoch and an end summary (FLOPs, MFU, peak memory); local
rank 0's device sampler; rank 0's straggler watch and network check. Nothing here synchronises the device
or adds a collective. The files and fields: docs/observability.md.
"""

from __future__ import annotations

import os
import statistics
import sys
from typing import Any, Callable

import torch

from trainscale.errors import ConfigError
from trainscale.runtime.memory import peak_memory

RECORD_VAR = "TRAINSCALE_RECORD"


class Observer:
    """The loop's recorder, sampler, straggler watch and network check; inert without a run directory."""

    def __init__(self, rt: Any, run_dir: str | None, *, environ: Any = os.environ, watch_every_s: float = 10.0) -> None:
        self.rt = rt
        self.run_dir = run_dir
        self.enabled = run_dir is not None
        self.environ = environ
        self.clock: Any = None  # the loop's StepClock, whose per-step records this writes
        self.recorder = self.sampler = self.watch = None
        self.flops_per_step: int | None = None
        self._batch: Any = None
        self.step_times: list[float] = []
        self.network_checked = False
        self.watch_every_s = watch_every_s

    @classmethod
    def for_run(cls, rt: Any, environ: Any = os.environ) -> "Observer":
        off = str(environ.get(RECORD_VAR, "1")).strip().lower() in ("0", "false", "no", "off")
        return cls(rt, None if off else rt.env.run_dir, environ=environ)

    def start(self, clock: Any, **meta: Any) -> "Observer":
        """Start recording the steps ``clock`` (train/timing.StepClock, made with ``record=self.enabled``) times."""
        self.clock = clock
        if not self.enabled:
            return self
        from trainscale.observe.records import RankRecorder
        from trainscale.observe.devices import publish
        from trainscale.observe.sampler import node_name, start_sampler

        rt = self.rt
        self.recorder = RankRecorder(self.run_dir, rt.rank, world_size=rt.world_size, device=str(rt.device),
                                     backend=rt.backend, threads=torch.get_num_threads(), **meta)
        publish(self.run_dir, node_name(), rt.rank, rt.device)  # which GPU is this rank's, for the sampler
        self.sampler = start_sampler(self.run_dir, local_rank=rt.local_rank, local_ranks=rt.local_world_size,
                                     environ=self.environ)
        if rt.is_main and rt.world_size > 1:
            from trainscale.observe.stragglers import StragglerWatch

            say = lambda text: print(text, file=sys.stderr, flush=True)  # noqa: E731
            self.watch = StragglerWatch(self.run_dir, say=say, every_s=self.watch_every_s).start()
        return self

    # -- per step ---------------------------------------------------------------------------------
    def keep_batch(self, batch: Any) -> None:
        """The first batch, to count a step's FLOPs with at the end (nothing is counted on the step path)."""
        if self.enabled and self._batch is None:
            self._batch = batch

    def step_done(self) -> None:
        """After the clock's ``end_step``: write the steps whose times are known."""
        if not self.enabled:
            return
        self._write(self.clock.ready())
        if not self.network_checked:
            self.network_checked = True
            self.check_network()

    def _write(self, records: list[dict[str, Any]]) -> None:
        for record in records:
            step, step_s = record.pop("step"), record.pop("step_s")
            self.step_times.append(step_s)
            self.recorder.step(step, step_s, **record)

    def epoch(self, epoch: int, model: Any, **fields: Any) -> None:
        if not self.enabled:
            return
        self._write(self.clock.ready(flush=True))
        timing = ddp_timing(model)
        self.recorder.epoch(epoch, **fields, **({"ddp": timing} if timing else {}))

    # -- the network --------------------------------------------------------------------------------
    def check_network(self) -> None:
        """Which network NCCL picked, against the profile's; a required mismatch stops the run here."""
        from trainscale.observe import interconnect

        expected = self.environ.get(interconnect.EXPECTED_VAR, "")
        path = self.environ.get("NCCL_DEBUG_FILE")
        if not expected or not path or "nccl" not in str(self.rt.backend) or self.rt.num_nodes < 2:
            return
        required = self.environ.get(interconnect.REQUIRED_VAR) == "1"
        verdict = interconnect.check_file(path, expected=expected, multi_node=True, required=required)
        if verdict.level != "ok" and self.rt.local_rank == 0:
            print(f"trainscale: network: {verdict.message}" + (f"\n  hint: {verdict.hint}" if verdict.hint else ""),
                  file=sys.stderr, flush=True)
        if self.rt.is_main:
            from trainscale.observe.records import note_event

            note_event(self.run_dir, kind="interconnect", level=verdict.level, message=verdict.message)
        if verdict.level == "error":
            raise ConfigError(verdict.message, hint=verdict.hint)

    # -- the end ----------------------------------------------------------------------------------
    def flush(self) -> None:
        """What is buffered, to disk (a run ending in an error keeps its records)."""
        if self.recorder is not None:
            self.recorder.out.flush()

    def close(self, model: Any, module: torch.nn.Module, *, build: Callable[[], torch.nn.Module],
              loss: Callable[[Any, Any], torch.Tensor], micro_batches: int = 1) -> dict[str, Any] | None:
        """Count a step's FLOPs (every rank alike: a sharded model's forward gathers), stop the threads,
        write the summary; returns it (None when not recording). ``model``: as trained (DDP's timing);
        ``module``: the user's module inside it; ``build``/``loss``: the task's."""
        if not self.enabled:
            return None
        self._write(self.clock.ready(flush=True))
        if self._batch is not None:
            self.flops_per_step = step_flops(module, build, loss, self._batch, micro_batches)
        dtype = next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)
        summary: dict[str, Any] = {"steps_recorded": len(self.step_times),
                                   "peak_mem_bytes": peak_memory(self.rt.device)[0]}
        if self.flops_per_step:
            from trainscale.observe.flops import mfu, peak_for

            median = statistics.median(self.step_times) if self.step_times else None
            peak = peak_for(self.rt.device, dtype)
            summary.update(flops_per_step=self.flops_per_step, step_median_s=median,
                           peak_flops=peak.flops if peak else None, peak_source=peak.source if peak else None,
                           mfu=mfu(self.flops_per_step, median, peak.flops) if peak and median else None)
        if self.watch is not None:
            self.watch.check()
            self.watch.stop()
        if self.sampler is not None:
            self.sampler.sample()
            self.sampler.stop()
        self.recorder.summary(**summary)
        self.recorder.close()
        return summary


def step_flops(module: torch.nn.Module, build: Callable[[], torch.nn.Module],
               loss: Callable[[Any, Any], torch.Tensor], batch: Any, micro_batches: int = 1) -> int | None:
    """FLOPs of one optimizer step (forward + backward of ``micro_batches`` batches like ``batch``), by
    torch's FlopCounterMode. A module with plain parameters (ddp, zero1) runs one forward without
    gradients (RNG and buffers restored after), and backward counts as twice the forward, which is what
    FlopCounterMode counts for matmuls and convolutions; a sharded one (fsdp, deepspeed) is rebuilt from
    ``build`` in fake tensors (shapes only; importing that machinery takes about a second). None where
    neither works (e.g. the loss reads a value)."""
    from trainscale.observe.flops import count_step_flops

    plain = all(type(p.data) is torch.Tensor and p.numel() > 0 and not hasattr(p, "ds_id")
                for p in module.parameters())
    try:
        if plain:
            buffers = {name: b.detach().clone() for name, b in module.named_buffers()}
            device = next((p.device for p in module.parameters()), torch.device("cpu"))
            devices = [device] if device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices), torch.no_grad():
                forward = count_step_flops(lambda: loss(module, batch))
            with torch.no_grad():
                for name, b in module.named_buffers():
                    b.copy_(buffers[name])
            return 3 * forward * micro_batches
        from torch._subclasses.fake_tensor import FakeTensorMode
        from torch.utils._pytree import tree_map

        with torch.random.fork_rng(devices=[]), FakeTensorMode(allow_non_fake_inputs=True) as fake:
            copy = build()
            fake_batch = tree_map(lambda t: fake.from_tensor(t) if isinstance(t, torch.Tensor) else t, batch)
            return count_step_flops(lambda: loss(copy, fake_batch).backward()) * micro_batches
    except Exception:  # counting is a nicety: a model it cannot count still trains
        return None


def ddp_timing(model: Any) -> dict[str, float] | None:
    """DDP's own averages (seconds per iteration over its sampled iterations), with exposed = comm - overlap."""
    getter = getattr(model, "_get_ddp_logging_data", None)
    if getter is None:
        return None
    try:
        data = getter()
    except Exception:
        return None
    keys = {"forward_s": "avg_forward_compute_time", "backward_compute_s": "avg_backward_compute_time",
            "comm_s": "avg_backward_comm_time", "overlap_s": "avg_backward_compute_comm_overlap_time"}
    if not all(isinstance(data.get(v), int) for v in keys.values()):
        return None  # fewer iterations than DDP's first sample
    out = {k: data[v] / 1e9 for k, v in keys.items()}
    out["exposed_comm_s"] = max(0.0, out["comm_s"] - out["overlap_s"])
    out["buckets"] = len(str(data.get("rebuilt_bucket_sizes") or data.get("bucket_sizes") or "").split(","))
    return out
