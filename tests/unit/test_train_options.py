"""The training loop's shape is checked before anything trains: accumulation that does not fit an
epoch, and a DeepSpeed spec that disagrees with the loop's batch or accumulation, name the fix."""

from __future__ import annotations

import importlib.util

import pytest
import torch

import trainscale
from trainscale.errors import ConfigError
from trainscale.train import Loop, Task, TrainOptions


def test_grad_accum_must_be_positive():
    with pytest.raises(ConfigError, match="--grad-accum 0 must be >= 1"):
        TrainOptions(grad_accum=0)


def test_more_micro_batches_per_step_than_an_epoch_holds_is_refused():
    from trainscale.data import DeviceTensorLoader

    loader = DeviceTensorLoader(torch.zeros(8, 2), batch_size=4)  # 2 micro-batches per epoch
    task = Task(
        name="t",
        model=lambda: torch.nn.Linear(2, 1),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
        loss=lambda model, batch: model(batch[0]).sum(),
        loader=loader,
        samples=8,
    )
    with trainscale.init(environ={}, set_threads=False) as rt:
        with pytest.raises(ConfigError, match="one epoch has 2 micro-batches, fewer than --grad-accum 3") as caught:
            Loop(rt, TrainOptions(batch_size=4, grad_accum=3), task)
    assert "lower --grad-accum or --batch-size" in caught.value.hint


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
def test_a_deepspeed_spec_that_disagrees_with_the_loop_is_refused():
    from trainscale.strategies import get_strategy

    strategy = get_strategy("deepspeed:stage=2").with_batch(16, 4)
    assert (strategy.micro_batch_size, strategy.gradient_accumulation_steps) == (16, 4)
    with pytest.raises(ConfigError, match="deepspeed:micro_batch_size=8, but the per-rank batch is 16"):
        get_strategy("deepspeed:micro_batch_size=8").with_batch(16)
    with pytest.raises(
        ConfigError, match="deepspeed:gradient_accumulation_steps=4, but the training loop accumulates 2"
    ) as caught:
        get_strategy("deepspeed:gradient_accumulation_steps=4").with_batch(16, 2)
    assert "--grad-accum" in caught.value.hint


def test_num_workers_is_for_the_dataloader_only():
    assert TrainOptions(loader="dataloader", num_workers=2).num_workers == 2
    with pytest.raises(ConfigError, match="--num-workers 2 with --loader tensor") as caught:
        TrainOptions(num_workers=2)
    assert "--loader dataloader" in caught.value.hint
    with pytest.raises(ConfigError, match="--num-workers -1 is negative"):
        TrainOptions(loader="dataloader", num_workers=-1)


def test_threads_compile_and_workers_resolve_in_the_one_order():
    from trainscale.train.options import parse

    opts, _ = parse(["--threads", "1", "--compile", "--loader", "dataloader", "--num-workers", "3"], prog="t")
    assert (opts.threads, opts.compile, opts.num_workers) == (1, True, 3)
    assert parse([], prog="t")[0].threads is None and parse([], prog="t")[0].compile is False
    assert parse(["--compile", "--no-compile"], prog="t")[0].compile is False
    import argparse

    from trainscale.train.options import options_from_args

    env = {"TRAINSCALE_TRAIN_THREADS": "2", "TRAINSCALE_TRAIN_COMPILE": "true"}
    opts, _ = options_from_args(argparse.Namespace(config=None), environ=env)
    assert (opts.threads, opts.compile) == (2, True)
    with pytest.raises(ConfigError, match="--threads 0 must be >= 1") as caught:
        TrainOptions(threads=0)
    assert "OMP_NUM_THREADS" in caught.value.hint


def test_threads_are_set_per_rank_and_said_once():
    from types import SimpleNamespace

    from trainscale.train.options import apply_threads

    said: list[str] = []
    before = torch.get_num_threads()
    try:
        apply_threads(TrainOptions(threads=1), SimpleNamespace(print=said.append))
        assert torch.get_num_threads() == 1 and said and "1 CPU thread(s) per rank (--threads" in said[0]
        apply_threads(TrainOptions(), SimpleNamespace(print=said.append))  # None: nothing changes
        assert torch.get_num_threads() == 1 and len(said) == 1
    finally:
        torch.set_num_threads(before)


def test_compile_without_a_working_cxx_compiler_is_refused(monkeypatch):
    from torch._inductor import cpp_builder

    from trainscale.train.options import check_compile

    check_compile()  # this machine has g++
    monkeypatch.setattr(
        cpp_builder,
        "get_cpp_compiler",
        lambda: (_ for _ in ()).throw(RuntimeError("No working C++ compiler found in ('g++',)")),
    )
    with pytest.raises(
        ConfigError,
        match="--compile needs a C.. compiler for torch.compile's inductor, and none "
        "works here .No working C.. compiler found",
    ) as caught:
        check_compile()
    assert "apt install g++" in caught.value.hint and "leave --compile out" in caught.value.hint


def test_compile_with_deepspeed_is_refused_before_launch():
    from trainscale.strategies import check_strategy

    check_strategy("ddp", 2, batch_size=16, compile=True)
    check_strategy("fsdp", 2, batch_size=16, compile=True)
    with pytest.raises(ConfigError, match="--compile with --strategy deepspeed") as caught:
        check_strategy("deepspeed:stage=2", 2, batch_size=16, compile=True)
    assert "leave --compile out" in caught.value.hint


def test_bad_numbers_and_an_unusable_checkpoint_directory_are_refused_in_the_launcher(in_tmp, capsys):
    """issue 35 item 4: --timeout nan/inf, --seed 2**70 and --experiment-dir naming a file ended in a traceback on
    every rank; an unusable --checkpoint-dir was refused only once every rank had started (75-160 s loaded),
    headed by the rank that relayed it. Each is one line from the launcher, before any rank starts."""
    from trainscale.cli.main import main

    (in_tmp / "afile").write_text("not a directory")
    run = ["run", "--nproc-per-node", "2", "--log-dir", "logs", "--workload"]
    cases = {
        ("cnn", "--timeout", "nan"): "--timeout nan must be a number of seconds",
        ("cnn", "--timeout", "inf"): "--timeout inf must be a number of seconds",
        ("cnn", "--seed", str(2**70)): f"--seed {2**70} is outside 0 ... 2**63 - 1",
        ("gpt", "--experiment-dir", "afile"): "--experiment-dir afile: ",
        ("cnn", "--checkpoint-dir", "afile/ck"): "--checkpoint-dir afile/ck is unusable: ",
    }
    for argv, said in cases.items():
        assert main([*run, *argv]) == 2, argv
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err and err.count("\n") <= 2, (argv, err)
    assert not (in_tmp / "logs").exists()  # no rank was started
