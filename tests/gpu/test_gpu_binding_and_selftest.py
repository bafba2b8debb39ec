"""CPU binding follows the visible GPUs' NUMA nodes; `trainscale selftest` passes on this node's GPUs."""

from __future__ import annotations

import json

import pytest
from helpers.gpu import trainscale

PROBE = """
import json, os, sys
import trainscale
from trainscale.topology import current_affinity
with trainscale.init(timeout_s=120) as rt:
    row = {"rank": rt.rank, "local_rank": rt.local_rank, "device": str(rt.device), "cpus": sorted(current_affinity())}
    with open(os.path.join(sys.argv[1], f"rank{rt.rank}.json"), "w") as fh:
        json.dump(row, fh)
"""


def _gpu_close_cores():
    from trainscale.topology import detect_topology

    topology = detect_topology()
    return topology, topology.gpu_cores()


@pytest.mark.needs_cuda
@pytest.mark.parametrize("visible", [None, "reversed"])
def test_each_rank_is_bound_to_its_visible_gpus_numa_cores(gpus, tmp_path, visible):
    gpus.need(2)
    topology, close = _gpu_close_cores()
    if not topology.gpus or len({tuple(c) for c in close.values()}) < 2:
        pytest.skip("this node's GPUs are not on distinct NUMA nodes (or the topology is unknown)")
    order = list(range(gpus.count))[::-1] if visible == "reversed" else list(range(gpus.count))
    extra = {"TRAINSCALE_CPU_BIND": "topology"}
    if visible:
        extra["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, order))
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    done = trainscale(
        tmp_path, "run", "--nproc-per-node", str(gpus.count), "--log-dir", "logs", str(script), str(tmp_path), **extra
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for local_rank in range(gpus.count):
        row = json.loads((tmp_path / f"rank{local_rank}.json").read_text())
        physical = order[local_rank]  # cuda:r is the r-th visible GPU
        assert row["device"] == f"cuda:{local_rank}"
        assert set(row["cpus"]) <= set(close[physical]), (local_rank, physical, row["cpus"], close[physical])


def test_selftest_passes_on_this_nodes_gpus(gpus, tmp_path):
    gpus.need(1)
    done = trainscale(tmp_path, "selftest", "--device", gpus.device, "--out", "st", timeout=1800)
    print(done.stdout)
    report = json.loads((tmp_path / "st" / "selftest.json").read_text())
    rows = {c["name"]: c for c in report["checks"]}
    failed = {name: c["figure"] for name, c in rows.items() if c["status"] == "fail"}
    assert not failed and done.returncode == 0, failed
    if not gpus.on_cpu:
        assert report["meta"]["backend"] in ("nccl", None) and report["meta"]["device"].startswith("cuda")
        if gpus.count >= 2:
            assert rows["all-reduce"]["detail"]["plateau"]["busbw_Bps"] > 0
