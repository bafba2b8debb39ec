"""`trainscale selftest`'s decisions on plain data: the hang verdict, its options, its output directory."""

from __future__ import annotations

import json

import pytest

from trainscale.cli.main import main
from trainscale.doctor.selftest import hang_record, hang_row, out_directory
from trainscale.errors import ConfigError


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
    assert verdict({"seconds": 5.5, "message": "Connection closed by peer"}, {"seconds": 6.0, "message": named}) == "pass"
    assert hang_row(tmp_path / "missing.json", 5.0, (True, ""))["status"] == "fail"


@pytest.mark.parametrize("argv, message", [
    (["--skip", "resum"], "--skip 'resum' is not a selftest check"),
    (["--nodes", "2"], "--nodes 2 needs --slurm"),
    (["--profile", "lumi"], "--profile only apply with --slurm"),
    (["--slurm", "--profile", "lumi"], "--slurm needs --profile and --time"),
])
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
    from trainscale.doctor.selftest_checks import allreduce_verdict
    from trainscale.observe.interconnect import intra_node_transports
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
    row now compares with the all-reduce check's bus bandwidth: a breakdown that sees a fraction of it fails."""
    from trainscale.doctor.selftest_checks import breakdown_verdict, implied_comm_s

    allreduce = {"detail": {"rows": [{"bytes": 2**20, "busbw_Bps": 0.4e9}, {"bytes": 16 * 2**20, "busbw_Bps": 0.5e9}]}}
    implied = implied_comm_s(25_190_400, 2, allreduce)  # 25.2 MB of gradients at 0.5 GB/s (nearest: 16 MB)
    assert implied == pytest.approx(25_190_400 / 0.5e9)
    seen = {"communication_total": 0.060, "communication": 0.050}
    assert breakdown_verdict(seen, implied, gpu=True) == ("pass", "")
    faked = {"communication_total": 0.005, "communication": 0.004}  # a faked link
    status, why = breakdown_verdict(faked, implied, gpu=True)
    assert status == "fail" and "misses communication" in why
    assert breakdown_verdict(faked, implied, gpu=False)[0] == "warn"  # CPU ranks share cores with it
    assert breakdown_verdict({"communication_total": 0.0, "communication": 0.0}, implied, gpu=False)[0] == "fail"
    assert breakdown_verdict({"communication_total": 0.01, "communication": 0.02}, implied, gpu=False)[0] == "fail"
    assert breakdown_verdict(seen, implied_comm_s(25_190_400, 2, None), gpu=True)[0] == "warn"


def test_a_rank_whose_current_device_is_not_its_own_gpu_fails_the_devices_row(monkeypatch):
    """Issue 22 item 10: every rank named cuda:{local rank} passed even when torch's current device (where its
    kernels and NCCL calls go) was another GPU."""
    from types import SimpleNamespace

    import torch

    from trainscale.doctor import selftest_checks

    props = SimpleNamespace(uuid="GPU-1", name="H100", pci_domain_id=0, pci_bus_id=1, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    rt = SimpleNamespace(rank=1, node_rank=0, local_rank=1, device=torch.device("cuda", 1), world_size=1,
                         is_distributed=False)
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

    from trainscale.doctor import selftest_checks

    buses = {0: 0xC1, 1: 0xC6}
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(
        uuid="", name="AMD Instinct MI250X", pci_domain_id=0, pci_bus_id=buses[device.index], pci_device_id=0))
    assert selftest_checks._gpu_id(torch.device("cuda", 0)) == "0000:c1:00.0"
    assert selftest_checks._gpu_id(torch.device("cuda", 0)) != selftest_checks._gpu_id(torch.device("cuda", 1))
