"""The simple path on one process: rt.setup with a ready optimizer or a factory, rt.backward, the
refusals that name the fix, and the older calls still working with a deprecation warning."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import trainscale
from trainscale.errors import ConfigError


@pytest.fixture
def rt(monkeypatch, tmp_path):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # torch sets it on first use
    with trainscale.init(environ={}, set_threads=False) as runtime:
        yield runtime


def _data():
    g = torch.Generator().manual_seed(3)
    return torch.randn(16, 8, generator=g), torch.randint(0, 2, (16,), generator=g)


def _model():
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 2))


def _groups(model):
    return [{"params": model[0].parameters(), "lr": 0.1}, {"params": model[2].parameters(), "lr": 0.01}]


def test_a_ready_optimizer_with_groups_trains_exactly_as_plain_torch(rt):
    x, y = _data()
    plain = _model()
    plain_opt = torch.optim.SGD(_groups(plain), lr=0.5, momentum=0.9)
    model = _model()
    model, opt = rt.setup(model, torch.optim.SGD(_groups(model), lr=0.5, momentum=0.9), strategy="ddp")
    assert [g["lr"] for g in opt.param_groups] == [0.1, 0.01]
    for _ in range(3):
        nn.functional.cross_entropy(plain(x), y).backward()
        plain_opt.step()
        plain_opt.zero_grad()
        rt.backward(nn.functional.cross_entropy(model(x), y))
        opt.step()
        opt.zero_grad()
    for a, b in zip(plain.parameters(), rt.unwrap(model).parameters()):
        assert torch.equal(a, b)


def test_step_leaves_the_gradients_to_zero_grad(rt):
    """The older strategy.step also zeroed the gradients; opt.step() is torch's own step now."""
    x, y = _data()
    model, opt = rt.setup(_model(), lambda params: torch.optim.SGD(params, lr=0.1))
    rt.backward(nn.functional.cross_entropy(model(x), y))
    opt.step()
    assert all(p.grad is not None for p in model.parameters())
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())


def test_an_optimizer_that_stepped_before_setup_is_refused(rt):
    model = _model()
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 8)).sum().backward()
    opt.step()
    with pytest.raises(ConfigError, match="the optimizer has stepped already") as caught:
        rt.setup(model, opt, strategy="fsdp")
    assert "call setup before the first optimizer step" in caught.value.hint


def test_an_optimizer_of_another_models_parameters_is_refused(rt):
    with pytest.raises(ConfigError, match="parameter\\(s\\) that are not the model's") as caught:
        rt.setup(_model(), torch.optim.SGD(_model().parameters(), lr=0.1), strategy="fsdp")
    assert "model.parameters()" in caught.value.hint


def test_backward_before_setup_names_the_fix(rt):
    with pytest.raises(ConfigError, match="no model was set up") as caught:
        rt.backward(torch.zeros((), requires_grad=True))
    assert "rt.setup(" in caught.value.hint


def test_an_lr_scheduler_takes_the_optimizer_setup_hands_out(rt):
    from trainscale.strategies.handout import through_strategy

    model, opt = rt.setup(_model(), lambda params: torch.optim.SGD(params, lr=1.0))
    handed = through_strategy(opt, rt.strategy_of(model), model)  # as fp16 FSDP and DeepSpeed hand it out
    scheduler = torch.optim.lr_scheduler.LambdaLR(handed, lambda step: 0.5**step)
    x, y = _data()
    rt.backward(nn.functional.cross_entropy(model(x), y))
    handed.step()
    scheduler.step()
    assert isinstance(handed, torch.optim.SGD) and opt.param_groups[0]["lr"] == 0.5
    assert handed.state_dict()["param_groups"][0]["lr"] == 0.5


def test_an_optimizer_over_part_of_the_model_keeps_to_that_part(rt):
    """A strategy that rebuilds the optimizer (FSDP's sharded parameters) rebuilds it over the same
    parameters, not the whole model."""
    model = _model()
    model, opt = rt.setup(model, torch.optim.SGD(model[2].parameters(), lr=0.1), strategy="fsdp")
    assert sum(len(g["params"]) for g in opt.param_groups) == 2
    frozen = model[0].weight.detach().clone()
    x, y = _data()
    rt.backward(nn.functional.cross_entropy(model(x), y))
    opt.step()
    assert torch.equal(model[0].weight, frozen) and not torch.equal(model[2].weight, _model()[2].weight)


def test_which_model_is_asked_when_several_were_set_up(rt):
    first, _ = rt.setup(_model(), lambda params: torch.optim.SGD(params, lr=0.1))
    rt.setup(_model(), lambda params: torch.optim.SGD(params, lr=0.1))
    x, y = _data()
    with pytest.raises(ConfigError, match="2 models were set up: which one?") as caught:
        rt.backward(nn.functional.cross_entropy(first(x), y))
    assert "rt.backward(loss, model)" in caught.value.hint
    with pytest.raises(ConfigError, match="this model was not set up on this runtime"):
        rt.backward(nn.functional.cross_entropy(first(x), y), _model())
    rt.backward(nn.functional.cross_entropy(first(x), y), first)
    assert first[0].weight.grad is not None
