"""`trainscale selftest`'s decisions on plain data: the hang verdict, its options, its output directory."""

from __future__ import annotations

import json

import pytest

from trainscale.cli.main import main
from trainscale.errors import ConfigError
from trainscale.selftest.run import hang_record, hang_row, out_directory


def test_a_hang_that_is_not_named_or_too_late_fails(tmp_path):
    path = tmp_path / "hang.json"
    named = "rank(s) 1 did not arrive\nrank 1's Python stack ...\n  in stop_participating"

    def verdict(*records: dict) -> str:
        for old in tmp_path.glob("hang.rank*.json"):
            old.unlink()
        for rank, record in enumerate(records):
            hang_record(path, rank).write_text(json.dumps({"hung_rank": 1, "backend": "nccl", **record}))
        return hang_row(path, 5.0, (False, ""))["status"]

    assert verdict({"seconds": 5.0, "message": "Timed out"}) == "fail"
    assert verdict({"seconds": 70.0, "message": named}) == "fail"
    assert verdict({"seconds": 6.0, "message": "rank(s) 1 did not arrive"}) == "fail"  # no stack
    assert verdict({"seconds": 6.0, "message": named}) == "pass"
    # every waiting rank records; any one that names the hung rank with its stack will do
    assert (
        verdict({"seconds": 5.5, "message": "Connection closed by peer"}, {"seconds": 6.0, "message": named}) == "pass"
    )
    assert hang_row(tmp_path / "missing.json", 5.0, (True, ""))["status"] == "fail"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--skip", "resum"], "--skip 'resum' is not a selftest check"),
        (["--nodes", "2"], "--nodes 2 needs --slurm"),
        (["--profile", "lumi"], "--profile only apply with --slurm"),
        (["--slurm", "--profile", "lumi"], "--slurm needs --profile and --time"),
    ],
)
def test_bad_options_are_refused_before_anything_runs(in_tmp, capsys, argv, message):
    assert main(["selftest", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Hint:" in err
    assert not (in_tmp / "selftest-out").exists()


def test_an_existing_report_directory_is_never_overwritten(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "selftest.json").write_text("{}")
    with pytest.raises(ConfigError, match="already exists and is not empty"):
        out_directory(tmp_path / "old")
    assert out_directory(tmp_path / "new") == tmp_path / "new"


FIXTURES = __import__("pathlib").Path(__file__).resolve().parents[1] / "fixtures"


def test_the_all_reduce_row_warns_when_nvlinked_gpus_fell_back_to_pcie_or_shared_memory():
    """Issue 22 item 8: a node whose GPUs lost NVLink used to show PASS at any bandwidth. The expectation
    comes from `nvidia-smi topo -m` (captured DGX/HGX A100 outputs) and NCCL's own log of how it connected."""
    from trainscale.observe.interconnect import intra_node_transports
    from trainscale.selftest.checks import allreduce_verdict
    from trainscale.topology.nvidia import expected_busbw_gbps, parse_nvidia_links

    dgx = parse_nvidia_links((FIXTURES / "topology" / "nvidia-smi-topo-dgx-a100-8gpu.txt").read_text())
    expected, links = expected_busbw_gbps(dgx, [0, 1, 2, 3])
    assert expected == 300.0 and "NV12" in links
    p2p = list(intra_node_transports((FIXTURES / "nccl" / "single-node.log").read_text()))
    shm = list(intra_node_transports((FIXTURES / "nccl" / "single-node-shm.log").read_text()))
    assert (p2p, shm) == (["P2P"], ["SHM"])
    assert allreduce_verdict(231.0, expected, links, p2p)[0] == "pass"  # what NVLink gives
    status, why = allreduce_verdict(21.0, expected, links, p2p)  # a PCIe link's speed on an NVLink node
    assert status == "warn" and "below 150 GB/s" in why and "NCCL_P2P_DISABLE" in why
    assert allreduce_verdict(231.0, expected, links, shm)[0] == "warn"  # fast enough, but through host memory
    assert allreduce_verdict(0.6, None, "", [])[0] == "pass"  # CPU ranks, or PCIe: no expectation to miss
    hgx = parse_nvidia_links((FIXTURES / "topology" / "nvidia-smi-topo-hgx-a100-4gpu.txt").read_text())
    assert expected_busbw_gbps(hgx, [0, 1]) == (100.0, "NVLink between every pair (weakest NV4: 4 x 25 GB/s)")
    assert expected_busbw_gbps({(0, 1): "PIX", (1, 0): "PIX"}, [0, 1])[0] is None


def test_the_breakdown_row_fails_when_it_misses_the_communication_the_link_implies():
    """Issue 22 item 7: `communication_total > 0` passed with a 52 KB gradient whatever was measured. The
    row compares with the all-reduce check's bus bandwidth: step records that see a fraction of it fail."""
    from trainscale.selftest.checks import breakdown_verdict, implied_comm_s

    allreduce = {"detail": {"rows": [{"bytes": 2**20, "busbw_Bps": 0.4e9}, {"bytes": 16 * 2**20, "busbw_Bps": 0.5e9}]}}
    implied = implied_comm_s(25_190_400, 2, allreduce)  # 25.2 MB of gradients at 0.5 GB/s (nearest: 16 MB)
    assert implied == pytest.approx(25_190_400 / 0.5e9)
    seen = {"backward": 0.010, "communication": 0.050}  # from the step records: backward's own, then exposed
    assert breakdown_verdict(seen, implied, gpu=True) == ("pass", "")
    faked = {"backward": 0.001, "communication": 0.004}  # a faked link, or marks timing work queued, not done
    status, why = breakdown_verdict(faked, implied, gpu=True)
    assert status == "fail" and "miss communication" in why
    assert breakdown_verdict(faked, implied, gpu=False)[0] == "warn"  # CPU ranks share cores with it
    assert breakdown_verdict({"backward": 0.06, "communication": 0.0}, implied, gpu=False)[0] == "fail"
    assert breakdown_verdict(seen, implied_comm_s(25_190_400, 2, None), gpu=True)[0] == "warn"


def test_a_rank_whose_current_device_is_not_its_own_gpu_fails_the_devices_row(monkeypatch):
    """Issue 22 item 10: every rank named cuda:{local rank} passed even when torch's current device (where its
    kernels and NCCL calls go) was another GPU."""
    from types import SimpleNamespace

    import torch

    from trainscale.selftest import checks as selftest_checks

    props = SimpleNamespace(uuid="GPU-1", name="H100", pci_domain_id=0, pci_bus_id=1, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    rt = SimpleNamespace(
        rank=1, node_rank=0, local_rank=1, device=torch.device("cuda", 1), world_size=1, is_distributed=False
    )
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    assert selftest_checks.check_devices(rt).status == "pass"
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    row = selftest_checks.check_devices(rt)
    assert row.status == "fail" and "torch's current device is cuda:0" in row.figure


def test_deterministic_mode_holds_only_inside_its_block():
    import torch

    from trainscale.runtime.determinism import deterministic

    before = torch.are_deterministic_algorithms_enabled()
    with deterministic():
        assert torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.deterministic
    assert torch.are_deterministic_algorithms_enabled() == before
    with deterministic(False):
        assert torch.are_deterministic_algorithms_enabled() == before


def test_gcds_that_share_a_uuid_are_told_apart_by_their_pci_address(monkeypatch):
    """Issue 22 item 10: two GCDs of an MI250X may report one UUID (or none); ranks on them are not sharing a GPU."""
    from types import SimpleNamespace

    import torch

    from trainscale.selftest import checks as selftest_checks

    buses = {0: 0xC1, 1: 0xC6}
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device: SimpleNamespace(
            uuid="", name="AMD Instinct MI250X", pci_domain_id=0, pci_bus_id=buses[device.index], pci_device_id=0
        ),
    )
    assert selftest_checks._gpu_id(torch.device("cuda", 0)) == "0000:c1:00.0"
    assert selftest_checks._gpu_id(torch.device("cuda", 0)) != selftest_checks._gpu_id(torch.device("cuda", 1))


@pytest.mark.parametrize("world_size", [1, 2, 3, 24, 64])
def test_the_ranks_shares_of_a_selftest_batch_make_up_the_whole_batch_on_any_world_size(world_size):
    """Issue 39 item 3: 32 samples split 32 // 24 = 1 each left 8 out of DDP (the one-process reference
    trained on all 32) and 32 // 64 = 0 left every rank an empty batch (three rows failed on NaN)."""
    from types import SimpleNamespace

    import torch

    from trainscale.selftest.checks import batch

    def rt(rank: int) -> SimpleNamespace:
        return SimpleNamespace(rank=rank, world_size=world_size, device=torch.device("cpu"))

    x, y = batch(1, rt(0), whole=True)
    shares = [batch(1, rt(r)) for r in range(world_size)]
    assert len(x) >= 32 and len({len(sx) for sx, _ in shares}) == 1
    assert torch.equal(torch.cat([sx for sx, _ in shares]), x) and torch.equal(torch.cat([sy for _, sy in shares]), y)


DGX_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)
"""The PCI buses of a DGX A100's GPUs 0..7 (tests/fixtures/topology/nvidia-smi-query-gpu-dgx-a100-8gpu.csv)."""


def _node_links_on_ranks(monkeypatch, device_index, physical, ranks: int = 4) -> list:
    """``node_links`` of a single-node job's ``ranks`` ranks on the fixtures' DGX A100, one thread each (their
    gather through a barrier): rank r drives ``cuda:device_index(r)``, which CUDA reports as the node's GPU
    ``physical(r)``. Faked at the boundary: torch's device properties, nvidia-smi's outputs, the gather."""
    import threading
    from types import SimpleNamespace

    import torch

    from trainscale.selftest import checks as selftest_checks
    from trainscale.topology import detect

    outputs = {
        "topo": (FIXTURES / "topology" / "nvidia-smi-topo-dgx-a100-8gpu.txt").read_text(),
        "--query-gpu=index,pci.bus_id,uuid": (
            FIXTURES / "topology" / "nvidia-smi-query-gpu-dgx-a100-8gpu.csv"
        ).read_text(),
    }
    monkeypatch.setattr(detect, "run_tool", lambda argv, timeout=15.0: outputs.get(argv[1]))
    monkeypatch.setattr(torch.version, "cuda", "12.4")
    here = threading.local()
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device: SimpleNamespace(
            name="NVIDIA A100-SXM4-80GB",
            uuid="",
            pci_domain_id=0,
            pci_bus_id=DGX_BUSES[physical(here.rank)],
            pci_device_id=0,
        ),
    )
    barrier, slots = threading.Barrier(ranks, timeout=10), [None] * ranks

    def gather(rt, value):
        slots[rt.rank] = value
        barrier.wait()
        every = list(slots)
        barrier.wait()
        return every

    monkeypatch.setattr(selftest_checks, "gather", gather)
    results: list = [None] * ranks

    def rank(r: int) -> None:
        here.rank = r
        rt = SimpleNamespace(
            rank=r,
            local_rank=r,
            world_size=ranks,
            local_world_size=ranks,
            node_rank=0,
            num_nodes=1,
            is_distributed=True,
            device=torch.device("cuda", device_index(r)),
        )
        try:
            results[r] = selftest_checks.node_links(rt)
        except Exception as exc:  # raised below, in the test's thread
            results[r] = exc
            barrier.abort()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for found in results:
        if isinstance(found, Exception):
            raise found
    return results


@pytest.mark.parametrize(
    "launch, visible, count, device_index, physical",
    [
        ("torchrun", "4,5,6,7", 4, lambda r: r, lambda r: 4 + r),  # local rank r drives cuda:r, the node's GPU 4 + r
        ("srun", "0", 1, lambda r: 0, lambda r: 4 + r),  # a cgroup per task: each rank's only GPU is its cuda:0
    ],
    ids=["torchrun", "srun"],
)
def test_the_all_reduce_row_expects_nvlink_between_the_physical_gpus_the_ranks_drive(
    monkeypatch, launch, visible, count, device_index, physical
):
    """Issue 39 item 5: the expectation took torch's visible indices for the node's, so with
    CUDA_VISIBLE_DEVICES=4,5,6,7, or srun's one GPU per task, there was none, and the SHM fallback's warning
    could never fire where per-task cgroups cause it. The ranks' GPUs are now found by PCI address."""
    import torch

    from trainscale.selftest.checks import allreduce_verdict

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    every = _node_links_on_ranks(monkeypatch, device_index, physical)
    assert len(set(every)) == 1, every  # every rank judges alike
    expected, links = every[0]
    assert expected == 300.0 and links == "GPUs 4,5,6,7: NVLink between every pair (weakest NV12: 12 x 25 GB/s)"
    status, why = allreduce_verdict(231.0, expected, links, ["P2P"])
    assert status == "pass" and "expected >= 150 GB/s over NVLink" in why
    status, why = allreduce_verdict(21.0, expected, links, ["P2P"])  # a PCIe link's speed
    assert status == "warn" and "below 150 GB/s" in why and "fell back from NVLink to PCIe or shared memory" in why
    status, why = allreduce_verdict(231.0, expected, links, ["SHM"])  # what per-task cgroups make NCCL do
    assert status == "warn" and "through host memory" in why and "srun --gpus-per-task" in why


def test_no_nvlink_expectation_when_nvidia_smi_does_not_list_the_jobs_other_gpus():
    """Where a cgroup per task hides the other GPUs from nvidia-smi too, their links are unknown: the row says
    so instead of judging four GPUs by the one it sees."""
    from trainscale.selftest.checks import job_links

    topo = (FIXTURES / "topology" / "nvidia-smi-topo-dgx-a100-8gpu.txt").read_text()
    query = (FIXTURES / "topology" / "nvidia-smi-query-gpu-dgx-a100-8gpu.csv").read_text()
    job = [{"pci": f"0000:{bus:02x}:00.0", "uuid": None} for bus in DGX_BUSES[4:]]
    assert job_links(topo, query, job)[0] == 300.0
    expected, why = job_links(topo, "0, 00000000:87:00.0, GPU-5d2c1f0e-8a41-4b7e-9c3d-0a1b2c3d4e54\n", job)
    assert expected is None and "does not list the job's GPU(s) 0000:90:00.0, 0000:b7:00.0, 0000:bd:00.0" in why
    by_uuid = [
        {"pci": None, "uuid": "5d2c1f0e-8a41-4b7e-9c3d-0a1b2c3d4e5" + str(i)} for i in (0, 1)
    ]  # torch's spelling
    assert job_links(topo, query, by_uuid) == (
        300.0,
        "GPUs 0,1: NVLink between every pair (weakest NV12: 12 x 25 GB/s)",
    )
