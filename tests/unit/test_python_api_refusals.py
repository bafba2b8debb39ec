"""The Python API's refusals, each before anything is launched or submitted: trainscale.slurm's options,
trainscale.launch's function, and the simple path's rt.log, rt.resume and rt.checkpoint."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import trainscale
from trainscale.errors import ConfigError
from trainscale.launch.runner import write_call
from trainscale.launch.slurm.api import build_spec, map_array


def test_slurm_options_are_the_jobs_fields_and_time_is_required(tmp_path):
    with pytest.raises(ConfigError, match="trainscale.slurm: unknown option 'node'") as unknown:
        build_spec({"module": "trainscale.launch.runner"}, {"node": 2, "time": "10"}, environ={})
    assert "did you mean 'nodes'" in unknown.value.hint
    with pytest.raises(ConfigError, match="trainscale.slurm: time= is required"):
        build_spec({"module": "trainscale.launch.runner"}, {"nodes": 2}, environ={})
    spec, profile = build_spec(
        {"module": "trainscale.launch.runner"},
        {"nodes": 2, "profile": "local-test", "modules": "load torch"},
        environ={"TRAINSCALE_SLURM_TIME": "00:10:00"},
    )  # the environment layer applies
    assert (spec.nodes, spec.time, spec.modules, profile.name) == (2, "00:10:00", ("load torch",), "local-test")
    with pytest.raises(ConfigError, match="no parameters to map over"):
        map_array(len, [], profile="local-test", time="10")
    with pytest.raises(ConfigError, match="is not a function"):
        write_call(tmp_path, 42, ())


@pytest.fixture
def rt(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    with trainscale.init(environ={}, set_threads=False) as runtime:
        yield runtime


def test_rt_log_resume_and_checkpoint_refuse_what_they_cannot_do(rt, tmp_path):
    with pytest.raises(ConfigError, match=r"rt.log\(reduce='avg'\) unknown") as bad:
        rt.log({"loss": 1.0}, reduce="avg")
    assert "mean" in bad.value.hint
    layer = nn.Linear(2, 1)
    model, optimizer = rt.setup(layer, torch.optim.SGD(layer.parameters(), lr=0.1))
    with pytest.raises(ConfigError, match="are trainscale's own checkpoint entries"):
        rt.resume(model, optimizer, step=3)
    with pytest.raises(ConfigError, match=r"rt.checkpoint\(every=0\) must be >= 1"):
        rt.checkpoint(1, model, optimizer, every=0)
    assert rt.resume(model, optimizer) == 0
    rt.checkpoint(1, model, optimizer, every=2)  # not a multiple of every: nothing saved
    rt.checkpoint(2, model, optimizer, every=2)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == [
        ".trainscale.lock",
        "ckpt-00000002.pt",
        "ckpt-00000002.pt.json",
    ]  # the run's lock on its directory
    assert rt.resume(model, optimizer) == 2
