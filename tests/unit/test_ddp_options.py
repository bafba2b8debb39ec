"""DDP's options behind ``--strategy ddp:key=value,...``: the bucket rule, static_graph, communication hooks,
and what is refused before training. Real DDP on a one-rank gloo group where torch's behaviour is the
point (how many buckets it makes, whether gloo all-reduces half precision)."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainscale.errors import ConfigError
from trainscale.strategies import check_strategy, comm_hooks, get_strategy
from trainscale.strategies.ddp import DDPStrategy, auto_bucket_cap_mb
from trainscale.strategies.hf_trainer import trainer_arguments
from trainscale.workloads.cnn import CNN

MiB = 1024 * 1024


@contextlib.contextmanager
def one_rank_group():
    """A real gloo process group of one rank (DDP, its buckets and collectives work as with N)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_options_parse_from_one_string_separated_by_commas():
    s = get_strategy("ddp:bucket_cap_mb=4,comm_hook=BF16,static_graph=false,gradient_as_bucket_view=false")
    assert (s.bucket_cap_mb, s.comm_hook, s.static_graph, s.gradient_as_bucket_view) == (4.0, "bf16", False, False)
    assert get_strategy("ddp").bucket_cap_mb == "auto" and get_strategy("ddp").static_graph == "auto"
    assert get_strategy("ddp:bucket_cap_mb=AUTO").bucket_cap_mb == "auto"
    assert get_strategy("ddp:comm_hook=fp16", comm_hook="powersgd").comm_hook == "powersgd"  # keyword wins
    z = get_strategy("zero1:comm_hook=fp16,powersgd_rank=2,powersgd_start=5")
    assert (z.name, z.comm_hook, z.powersgd_rank, z.powersgd_start) == ("zero1", "fp16", 2, 5)


@pytest.mark.parametrize(
    "spec, message, hint",
    [
        ("ddp:comm_hook=fp61", "is not a communication hook", "did you mean 'fp16'"),
        ("ddp:comm_hook=nccl", "is not a communication hook", "bf16, fp16, none, powersgd"),
        ("ddp:comm_hok=fp16", "has no option 'comm_hok'", "did you mean 'comm_hook'"),
        ("ddp:bucket_cap_mb=big", "is neither a size in MiB nor auto", "bucket_cap_mb=auto"),
        ("ddp:bucket_cap_mb=0", "must be a positive size in MiB", "bucket_cap_mb=4"),
        ("ddp:bucket_cap_mb=-2", "must be a positive size in MiB", "bucket_cap_mb=4"),
        ("ddp:bucket_cap_mb=inf", "must be a positive size in MiB", "bucket_cap_mb=4"),
        ("ddp:static_graph=maybe", "is not auto, true or false", "static_graph=auto"),
        ("ddp:powersgd_start=1", "must be >= 2", "powersgd_start=10"),
        ("ddp:powersgd_rank=0", "must be >= 1", "powersgd_rank=1"),
        ("ddp:powersgd_rank=two", "is not a number", "powersgd_rank=1"),
        ("ddp:find_unused_parameters=auto", "is not a boolean", "find_unused_parameters=true"),
    ],
)
def test_bad_options_are_refused_naming_the_fix(spec, message, hint):
    with pytest.raises(ConfigError, match=message) as caught:
        get_strategy(spec)
    assert hint in caught.value.hint


def test_the_bucket_rule_is_a_quarter_of_the_gradient_between_1_and_25_mib():
    cnn_bytes = 4_799_528
    assert auto_bucket_cap_mb(cnn_bytes) == pytest.approx(cnn_bytes / 4 / MiB)  # 1.14 MiB
    assert auto_bucket_cap_mb(2 * MiB) == 1.0  # small models: 1 MiB, latency stays small beside the transfer
    assert auto_bucket_cap_mb(40 * MiB) == 10.0
    assert auto_bucket_cap_mb(400 * MiB) == 25.0
    ddp = DDPStrategy()
    assert ddp.bucket_arguments(CNN()) == {"bucket_cap_mb": pytest.approx(cnn_bytes / 4 / MiB)}
    big = nn.Sequential(*[nn.Linear(2048, 2048) for _ in range(7)])  # 112 MiB: torch's own layout
    assert ddp.bucket_arguments(big) == {"bucket_cap_mb": None}
    assert DDPStrategy(bucket_cap_mb=25).bucket_arguments(CNN()) == {"bucket_cap_mb": 25.0}  # as given


def _buckets(model: nn.Module, **ddp_kwargs) -> list[int]:
    """Bucket all-reduces in each of DDP's first three backward passes (counted by a hook of the test's own)."""
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook

    ddp = DistributedDataParallel(model, **ddp_kwargs)

    launched: list[int] = []
    ddp.register_comm_hook(None, lambda state, bucket: launched.append(1) or allreduce_hook(state, bucket))
    x, y = torch.randn(4, 1, 28, 28), torch.randint(0, 10, (4,))
    counts = []
    for _ in range(3):
        launched.clear()
        nn.functional.nll_loss(ddp(x), y).backward()
        counts.append(len(launched))
    return counts


def test_torch_makes_one_bucket_of_the_cnn_with_an_explicit_25_mib_and_two_with_auto():
    """torch 2.13 keeps its small first bucket only when bucket_cap_mb is left to it; trainscale used to
    pass 25 explicitly, so the cnn's whole gradient was one bucket whose all-reduce started after backward.
    (DDP's first backward always uses one bucket; it lays them out by readiness after it.)"""
    with one_rank_group():
        before = _buckets(CNN(), bucket_cap_mb=25)
        after = _buckets(CNN(), **DDPStrategy().bucket_arguments(CNN()))
        torch_default = _buckets(CNN())
    assert before == [1, 1, 1]
    assert after == [1, 2, 2] and torch_default == [1, 2, 2]  # fc2 + fc1 in the first, the convs in the last


def test_static_graph_auto_is_on_only_in_the_loop_without_accumulation():
    ddp = get_strategy("ddp")
    assert ddp.uses_static_graph() is False  # rt.setup in a script: trainscale cannot see the graph
    assert ddp.with_batch(16, 1).uses_static_graph() is True
    assert ddp.with_batch(16, None).uses_static_graph() is True
    assert ddp.with_batch(16, 4).uses_static_graph() is False  # torch fails with no_sync and a static graph
    assert get_strategy("ddp:find_unused_parameters=true").with_batch(16, 1).uses_static_graph() is False
    assert get_strategy("ddp:static_graph=false").with_batch(16, 1).uses_static_graph() is False
    assert get_strategy("ddp:static_graph=true").uses_static_graph() is True
    assert ddp.static_graph == "auto"  # with_batch returned a copy


def test_static_graph_with_accumulation_is_refused_before_launch():
    with pytest.raises(ConfigError, match="static_graph=true with --grad-accum 2") as caught:
        check_strategy("ddp:static_graph=true", 2, batch_size=16, accumulation=2)
    assert "static_graph=auto" in caught.value.hint
    check_strategy("ddp:static_graph=true", 2, batch_size=16, accumulation=1)
    check_strategy("ddp", 2, batch_size=16, accumulation=2)


def test_no_sync_on_a_static_graph_is_refused_instead_of_torchs_internal_assert():
    strategy = get_strategy("ddp:static_graph=true")
    with one_rank_group():
        model = DistributedDataParallel(nn.Linear(4, 4), static_graph=True)
        with pytest.raises(ConfigError, match="no_sync") as caught:
            strategy.accumulate(model, last=False)
        assert "static_graph=false" in caught.value.hint
        with strategy.accumulate(model, last=True):  # the synchronising micro-batch is fine
            pass


def test_gloo_all_reduces_half_precision_here_and_a_backend_that_cannot_is_refused(monkeypatch):
    with one_rank_group():
        for name in ("fp16", "bf16", "none", "powersgd"):
            comm_hooks.check_backend(name, torch.device("cpu"))  # torch 2.13's gloo: both dtypes work

        def unsupported(tensor, group=None):
            raise RuntimeError(f"Unsupported dtype {tensor.dtype}\nmore")

        monkeypatch.setattr(dist, "all_reduce", unsupported)
        with pytest.raises(
            ConfigError,
            match=r"comm_hook=bf16: the gloo backend cannot all-reduce torch.bfloat16 "
            r"here \(Unsupported dtype torch.bfloat16\)",
        ) as caught:
            comm_hooks.check_backend("bf16", torch.device("cpu"))
        assert "comm_hook=fp16" in caught.value.hint and "comm_hook=none" in caught.value.hint
        comm_hooks.check_backend("powersgd", torch.device("cpu"))  # fp32 all-reduces: nothing to probe


def test_powersgd_on_gloo_gets_one_bucket_and_an_explicit_smaller_one_is_refused():
    said: list[str] = []
    runtime = SimpleNamespace(device=torch.device("cpu"), print=said.append)
    with one_rank_group():
        plan = get_strategy("ddp:comm_hook=powersgd")._bucket_plan(CNN(), runtime)
        assert plan == {"bucket_cap_mb": 5.0} and "one gradient bucket of 5 MiB" in said[0]
        assert get_strategy("ddp:comm_hook=powersgd,bucket_cap_mb=8")._bucket_plan(CNN(), runtime) == {
            "bucket_cap_mb": 5.0
        }
        with pytest.raises(ConfigError, match="comm_hook=powersgd with bucket_cap_mb=1.0 on gloo") as caught:
            get_strategy("ddp:comm_hook=powersgd,bucket_cap_mb=1")._bucket_plan(CNN(), runtime)
        assert "bucket_cap_mb=5 or auto" in caught.value.hint
        assert get_strategy("ddp:comm_hook=fp16")._bucket_plan(CNN(), runtime) == DDPStrategy().bucket_arguments(CNN())


def _done(value):
    future = torch.futures.Future()
    future.set_result(value)
    return future


def test_the_chosen_hook_gets_each_bucket_and_passes_its_result_through():
    seen = []
    hook = comm_hooks.CommHook(
        "fp16", lambda state, bucket: seen.append((state, bucket)) or _done(torch.ones(3)), state="S"
    )
    assert torch.equal(comm_hooks._run(hook, "bucket-0").wait(), torch.ones(3)) and seen == [("S", "bucket-0")]


class FakeDDP(nn.Module):
    """Stands for a DDP module: one comm hook at most, as torch enforces."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.hooks: list = []

    def register_comm_hook(self, state, hook) -> None:
        if self.hooks:
            raise RuntimeError("register_comm_hook or register_builtin_comm_hook can only be called once.")
        self.hooks.append((state, hook))


def test_one_hook_is_registered_for_a_chosen_hook_and_none_without_one():
    chosen = FakeDDP()
    hook = comm_hooks.attach(chosen, "bf16")
    assert len(chosen.hooks) == 1 and comm_hooks.attached(chosen) is hook and hook.name == "bf16"
    assert comm_hooks.attached(FakeDDP()) is None  # none chosen: DDP keeps its built-in all-reduce


def test_the_hf_trainer_maps_auto_and_refuses_a_hook_it_cannot_run():
    args = trainer_arguments("ddp", world_size=2, per_device=4, use_cpu=True)
    assert args == {"ddp_find_unused_parameters": False, "ddp_bucket_cap_mb": None}  # torch's own layout
    trainer_arguments("ddp:static_graph=false", world_size=2, per_device=4, use_cpu=True)
    with pytest.raises(ConfigError, match="comm_hook=fp16 has no HF Trainer argument"):
        trainer_arguments("ddp:comm_hook=fp16", world_size=2, per_device=4, use_cpu=True)


def test_advice_is_zero1_only_for_a_replicated_optimizer_step_that_dominates():
    ddp = get_strategy("ddp")
    assert "try --strategy zero1" in ddp.advice(2, 0.30)
    assert ddp.advice(2, 0.20) is None and ddp.advice(1, 0.9) is None
    assert get_strategy("zero1").advice(2, 0.9) is None and get_strategy("fsdp").advice(2, 0.9) is None


def test_the_report_suggests_zero1_for_a_studys_ddp_run_dominated_by_the_optimizer(tmp_path):
    from trainscale.report.gather import Gathered
    from trainscale.report.verdict import findings

    def gathered(strategy: str, share: float) -> Gathered:
        runs = [
            {"status": "ok", "world_size": 1, "strategy": strategy, "breakdown": {"optimizer_fraction": 0.5}},
            {"status": "ok", "world_size": 2, "strategy": strategy, "breakdown": {"optimizer_fraction": share}},
        ]
        return Gathered(source=tmp_path, ranks=[], samples={}, events=[], study={"runs": runs})

    texts = [f.message for f in findings(gathered("ddp", 0.31)) if f.level == "problem"]
    assert texts == [
        "the optimizer step takes 31% of the step and every rank runs all of it: try --strategy zero1 "
        "(each of the 2 ranks updates its own part of the parameters, whole tensors at a time; "
        "docs/strategies.md)"
    ]
    assert not findings(gathered("ddp", 0.10)) and not findings(gathered("zero1", 0.5))


def test_shm_is_refused_off_the_cpu():
    from trainscale.strategies.shm_allreduce import check_device

    check_device(torch.device("cpu"))
    with pytest.raises(ConfigError, match="averages CPU gradients, but this run trains on cuda") as caught:
        check_device(torch.device("cuda", 0))
    assert "comm_hook=none" in caught.value.hint
