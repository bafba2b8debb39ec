"""Checkpoints written by an earlier version of this code (tests/fixtures/checkpoints, made by
make_fixtures.py when layout.FORMAT became 2) still verify and load, exactly: a rank-0 file (ddp) and
a sharded DCP directory written by two ranks (fsdp), each into a model with other weights. A change
that breaks them changes the on-disk contract: raise layout.FORMAT and remake them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.utils._pytree import tree_flatten

import trainscale

FIXTURES = Path(__file__).parents[1] / "fixtures" / "checkpoints"
sys.path.insert(0, str(FIXTURES))
import make_fixtures  # noqa: E402  (the model and the step count the fixtures were made with)


def _fresh_model() -> torch.nn.Module:
    net = make_fixtures.model()
    with torch.no_grad():
        for p in net.parameters():
            p.fill_(0.5)  # other weights: only the checkpoint can restore the saved ones
    return net


def _full(net, opt) -> dict:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_state, optim_state = get_state_dict(net, opt, options=StateDictOptions(full_state_dict=True))
    return {"model": model_state, "optimizer": optim_state}


def _assert_same(a, b) -> None:
    flat_a, spec_a = tree_flatten(a)
    flat_b, spec_b = tree_flatten(b)
    assert spec_a == spec_b and flat_a
    for x, y in zip(flat_a, flat_b):
        assert torch.equal(x, y) if torch.is_tensor(x) else x == y


@pytest.mark.parametrize("name", ["ddp", "fsdp"])
def test_a_checkpoint_written_before_the_contract_changed_still_restores(name, monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # torch sets it on first use
    from trainscale.checkpoint import Checkpointer, RNGState
    from trainscale.runtime.seed import rng_state

    expected = torch.load(FIXTURES / f"expected-{name}.pt", weights_only=True)
    with trainscale.init(environ={}, set_threads=False) as rt:
        net = _fresh_model()
        net, opt = rt.setup(net, torch.optim.Adam(net.parameters(), lr=0.1), strategy=name)
        ckpt = Checkpointer(FIXTURES / name, rt, strategy=rt.strategy_of(net))
        found = ckpt.restore({"model": rt.checkpoint_state(net, opt), "rng": RNGState(rt.device)})
        assert found.step == found.contents["step"] == make_fixtures.STEPS
        assert found.contents["epoch_steps"] == make_fixtures.EPOCH_STEPS
        assert found.record["world_size"] == (1 if name == "ddp" else 2)
        restored = rng_state(rt.device)
        _assert_same(_full(net, opt), expected)
    assert torch.equal(restored["torch"], found.contents["rng"]["torch"])
