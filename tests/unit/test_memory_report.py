"""The memory report counts each storage once and prints one line per rank."""

from __future__ import annotations

import torch

from trainscale.runtime import memory


def test_tensor_bytes_counts_each_storage_once():
    bucket = torch.zeros(100)  # like DDP's gradient bucket: the grads are views into it
    views = [bucket[:60], bucket[60:]]
    other = torch.zeros(10, dtype=torch.float64)
    assert memory.tensor_bytes(views + [None, other, other.view(2, 5)]) == 100 * 4 + 10 * 8
    assert memory.tensor_bytes([]) == 0
    assert memory.tensor_bytes([torch.empty(0)]) == 0  # a freed (ZeRO-3-style) parameter holds nothing


def test_strategy_counts_params_grads_and_optimizer_state(in_tmp, monkeypatch):
    import trainscale

    # torch's optimizer import may point TORCHINDUCTOR_CACHE_DIR somewhere; monkeypatch restores it
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(in_tmp / "inductor"))
    from trainscale.strategies import get_strategy
    from trainscale.strategies.base import OptimizerSpec

    with trainscale.init(environ={}, device="cpu", set_threads=False) as rt:
        strategy = get_strategy("ddp")
        model, opt = strategy.wrap(torch.nn.Linear(100, 10), OptimizerSpec(torch.optim.Adam, {"lr": 0.1}), rt)
        strategy.backward_loss(model(torch.randn(4, 100)).sum(), model)
        strategy.micro_step(opt, model, last=True)
        held = strategy.held_bytes(model, opt)
        assert held["params"] == held["grads"] == 1010 * 4
        assert held["optimizer"] >= 2 * 1010 * 4  # exp_avg + exp_avg_sq (+ step counters)
        result = memory.report(rt, held, "ddp", print_table=False)
    (row,) = result["ranks"]
    assert row["rank"] == 0 and row["state"] == sum(held.values()) and row["peak_bytes"] > 2**20
    assert result["peak_source"] == "process peak RSS"


def test_table_has_a_line_per_rank_and_a_total():
    rows = [
        memory.RankMemory(
            rank=r, peak_bytes=2**30, peak_source="process peak RSS", params=2**20, grads=2**20, optimizer=2**21
        )
        for r in range(2)
    ]
    lines = memory.format_table(rows, "fsdp").splitlines()
    assert "fsdp" in lines[0] and "process peak RSS" in lines[0]
    assert lines[2].split() == ["0", "1024.00", "1.00", "1.00", "2.00", "4.00"]
    assert lines[-1].split() == ["total", "2.00", "2.00", "4.00", "8.00"]
