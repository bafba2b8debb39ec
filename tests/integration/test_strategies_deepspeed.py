"""DeepSpeed ZeRO-3 on 2 gloo ranks: same parameters as DDP after K Adam steps (max |Δ| / max |p| <= 1e-6
per tensor: DeepSpeed steps the same torch Adam on flat fp32 partitions of the same averaged
gradients), state sharded per rank, and a checkpoint that resumes exactly.

Kept to one multi-rank run: DeepSpeed compiles a communication op on its first start (about a minute
on 2 cores, cached in TORCH_EXTENSIONS_DIR afterwards).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from helpers.multiproc import run_on_ranks
from integration.test_strategies import batches, mlp, train
from torch import nn

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("deepspeed") is None,
        reason="deepspeed is not installed (pip install 'trainscale[deepspeed]'); the deepspeed strategy is optional",
    ),
]

# Every parameter partitioned (DeepSpeed keeps tensors below 1e5 elements whole by default, which for
# this small model would be all of them).
ZERO3 = {"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0}}


def _deepspeed(rt):
    from trainscale.strategies import get_strategy

    return get_strategy("deepspeed", micro_batch_size=16 // rt.world_size, overrides=ZERO3)


def _full_params(engine) -> dict[str, torch.Tensor]:
    import deepspeed

    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        return {k: v.detach().clone().float() for k, v in engine.module.state_dict().items()}


def _optimizer_tensors(engine) -> list[torch.Tensor]:
    zero = engine.optimizer
    state = [v.clone() for per in zero.optimizer.state.values() for k, v in sorted(per.items()) if torch.is_tensor(v)]
    return [t.detach().clone() for t in zero.fp32_partitioned_groups_flat] + state


def deepspeed_vs_ddp(root: str) -> dict:
    import trainscale
    from trainscale.checkpoint import Checkpointer
    from trainscale.strategies.base import OptimizerSpec

    adam = OptimizerSpec(torch.optim.Adam, {"lr": 1e-2})
    with trainscale.init(seed=0) as rt:
        ddp_params, ddp_bytes = train(rt, "ddp", adam)
        strategy = _deepspeed(rt)
        engine, opt = strategy.wrap(mlp(), adam, rt)
        for x, y in batches(rt.rank, rt.world_size):
            strategy.backward_loss(nn.functional.cross_entropy(engine(x), y), engine)
            strategy.micro_step(opt, engine, last=True)
        ds_bytes = strategy.held_bytes(engine, opt)
        ckpt = Checkpointer(root, rt, strategy=strategy)
        ckpt.save(4, {"model": strategy.checkpoint_state(engine, opt), "step": 4})
        saved = {"params": _full_params(engine), "optimizer": _optimizer_tensors(engine)}

        again = _deepspeed(rt)  # a fresh engine from other weights, resumed from the checkpoint
        model = mlp()
        with torch.no_grad():
            for p in model.parameters():
                p.normal_()
        engine2, opt2 = again.wrap(model, adam, rt)
        found = Checkpointer(root, rt, strategy=again).restore({"model": again.checkpoint_state(engine2, opt2)})
        resumed = {"params": _full_params(engine2), "optimizer": _optimizer_tensors(engine2)}
    return {
        "ddp": ddp_params,
        "ddp_bytes": ddp_bytes,
        "ds": saved["params"],
        "ds_bytes": ds_bytes,
        "saved": saved,
        "resumed": resumed,
        "found_step": found.step,
        "format": found.shards.format,
    }


def test_deepspeed_zero3_matches_ddp_shards_state_and_resumes(tmp_path):
    from trainscale.strategies.deepspeed import extensions_dir

    results = run_on_ranks(
        deepspeed_vs_ddp, 2, str(tmp_path), timeout=600, env={"TORCH_EXTENSIONS_DIR": extensions_dir()}
    )
    r0 = results[0]
    for k, ref in r0["ddp"].items():
        assert float((ref - r0["ds"][k]).abs().max() / ref.abs().max()) <= 1e-6, k
    for rank, res in results.items():
        d, z = res["ddp_bytes"], res["ds_bytes"]
        print(f"rank {rank} bytes: ddp {d}, deepspeed zero-3 {z}")
        assert z["params"] <= d["params"] / 2 * 1.05 and z["grads"] <= d["grads"] / 2 * 1.05
        # Adam's two moments + DeepSpeed's fp32 master copy, all partitioned: (2P + P) / 2
        assert z["optimizer"] <= (d["optimizer"] + d["params"]) / 2 * 1.05
        assert res["found_step"] == 4 and res["format"] == "deepspeed"
        assert all(torch.equal(a, b) for a, b in zip(res["saved"]["optimizer"], res["resumed"]["optimizer"]))
        assert len(res["saved"]["optimizer"]) == len(res["resumed"]["optimizer"]) > 1
    assert all(torch.equal(v, r0["resumed"]["params"][k]) for k, v in r0["saved"]["params"].items())
    assert (tmp_path / "ckpt-00000004" / "trainscale.json").is_file()


SINGLE_PROCESS_ON_A_GPU_NODE = """
import json, sys
import torch
# The one narrow fake: this process believes a GPU is present, as on a GPU node. DeepSpeed then picks
# its CUDA accelerator on import, unless told otherwise, and would move the model to cuda:0.
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: 1
import trainscale
from trainscale.strategies import get_strategy
from trainscale.strategies.base import OptimizerSpec

with trainscale.init(device="cpu", set_threads=False) as rt:
    strategy = get_strategy("deepspeed:stage=1", micro_batch_size=4)
    engine, opt = strategy.wrap(torch.nn.Linear(8, 2), OptimizerSpec(torch.optim.SGD, {"lr": 0.1}), rt)
    loss = engine(torch.randn(4, 8)).sum()
    strategy.backward_loss(loss, engine)
    strategy.micro_step(opt, engine, last=True)
    from deepspeed.accelerator import get_accelerator
    print(json.dumps({"param": str(next(engine.module.parameters()).device), "engine": str(engine.device),
                      "accelerator": get_accelerator().device_name()}))
"""


def test_device_cpu_on_a_gpu_node_keeps_deepspeed_on_the_cpu_in_one_plain_process(tmp_path):
    """Defect 9 (the CPU accelerator is chosen before DeepSpeed is imported) and defect 1's plain-python
    half (DeepSpeed asserts LOCAL_RANK, which no launcher set here)."""
    import json
    import os
    import subprocess
    import sys

    from trainscale.strategies.deepspeed import extensions_dir

    env = {k: v for k, v in os.environ.items() if k not in ("LOCAL_RANK", "RANK", "WORLD_SIZE", "DS_ACCELERATOR")}
    env.update(TORCH_EXTENSIONS_DIR=extensions_dir(), OMP_NUM_THREADS="1")
    done = subprocess.run(
        [sys.executable, "-c", SINGLE_PROCESS_ON_A_GPU_NODE],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {"param": "cpu", "engine": "cpu", "accelerator": "cpu"}
    assert "DS_ACCELERATOR=cpu" in done.stdout  # said once, with the reason
