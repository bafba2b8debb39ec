"""The node's sampler reads the job's own GPUs (issue 22 item 3): those its ranks published, by UUID on
NVIDIA and PCI address on AMD, each reading labelled with its rank, "N/A" read as nothing. The
management libraries are faked at their API (shapes as nvidia-ml-py and amdsmi return them); a
GPU's identity comes from torch's device properties, faked the same way."""

from __future__ import annotations

import json
from types import SimpleNamespace

import torch

from trainscale.observe import devices
from trainscale.observe.devices import AmdSmi, JobGpus, Nvml, number, published
from trainscale.observe.sampler import Sampler


class FakeNvml:
    """A node of four GPUs; the job got the last two (a partial node)."""

    UUIDS = ["GPU-aaaa", "GPU-bbbb", "GPU-cccc", "GPU-dddd"]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return self.UUIDS.index(uuid)

    def nvmlDeviceGetHandleByPciBusId_v2(self, pci):
        return {"0000:c1:00.0": 2, "0000:c2:00.0": 3}[pci]

    def nvmlDeviceGetUtilizationRates(self, h):
        return SimpleNamespace(gpu=[5, 5, 91, 89][h], memory=0)

    def nvmlDeviceGetMemoryInfo(self, h):
        return SimpleNamespace(used=(h + 1) * 2**30, total=80 * 2**30, free=0)

    def nvmlDeviceGetPowerUsage(self, h):
        return 350_000  # mW


class FakeAmdSmi:
    """An MI250X's two GCDs sharing one UUID, the second reporting its power as "N/A"."""

    def amdsmi_get_processor_handles(self):
        return ["h0", "h1"]

    def amdsmi_get_gpu_device_uuid(self, handle):
        return "SAME-UUID"

    def amdsmi_get_processor_handle_from_bdf(self, bdf):
        return {"0000:c1:00.0": "h0", "0000:c6:00.0": "h1"}[bdf]

    def amdsmi_get_gpu_activity(self, handle):
        return {"gfx_activity": 97 if handle == "h0" else "N/A", "umc_activity": 10}

    def amdsmi_get_gpu_vram_usage(self, handle):
        return {"vram_used": 1024, "vram_total": 65520}

    def amdsmi_get_power_info(self, handle):
        return {"average_socket_power": 400 if handle == "h0" else "N/A"}


def publish_as(tmp_path, monkeypatch, host, rank, uuid, pci):
    props = SimpleNamespace(uuid=uuid, pci_domain_id=0, pci_bus_id=int(pci, 16), pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: props)
    devices.publish(tmp_path, host, rank, torch.device("cuda", 0))


def test_an_nvidia_job_on_part_of_a_node_samples_only_its_gpus(tmp_path, monkeypatch):
    publish_as(tmp_path, monkeypatch, "n1", 4, "GPU-CCCC", "c1")  # torch's UUID, upper case with the prefix
    reader = JobGpus(tmp_path, "n1", local_ranks=2, lib=Nvml(FakeNvml()))
    assert [g["rank"] for g in reader()] == [4]  # the second rank has not published yet: not complete
    publish_as(tmp_path, monkeypatch, "n1", 5, "dddd", "c2")
    gpus = reader()
    assert [(g["rank"], g["util_pct"]) for g in gpus] == [(4, 91.0), (5, 89.0)]  # never GPUs 0 and 1 at 5%
    assert gpus[0]["mem_used"] == 3 * 2**30 and gpus[0]["power_w"] == 350.0 and gpus[0]["uuid"] == "cccc"
    assert [d["rank"] for d in published(tmp_path, "n1")] == [4, 5] and published(tmp_path, "n2") == []


def test_gcds_that_share_a_uuid_are_found_by_pci_and_na_reads_as_nothing(tmp_path, monkeypatch):
    publish_as(tmp_path, monkeypatch, "nid001", 0, "SAME-UUID", "c1")
    publish_as(tmp_path, monkeypatch, "nid001", 1, "SAME-UUID", "c6")
    gpus = JobGpus(tmp_path, "nid001", local_ranks=2, lib=AmdSmi(FakeAmdSmi()))()
    assert [(g["rank"], g["util_pct"], g["power_w"]) for g in gpus] == [(0, 97.0, 400.0), (1, None, None)]
    assert gpus[1]["mem_total"] == 65520 * 2**20
    # the same GCDs found by UUID would both be the first one: with NVML's preference a shared UUID falls back too
    shared = devices.resolve(
        Nvml(FakeNvml()),
        [{"rank": 0, "uuid": "x", "pci": "0000:c1:00.0"}, {"rank": 1, "uuid": "x", "pci": "0000:c2:00.0"}],
    )
    assert [handle for _, handle in shared] == [2, 3]


def test_readings_become_numbers_or_none():
    assert [number(v) for v in (87, 12.5, "42", "N/A", None, {"a": 1}, True)] == [
        87.0,
        12.5,
        42.0,
        None,
        None,
        None,
        None,
    ]


def test_a_sample_without_gpus_has_none_and_a_cpu_rank_publishes_nothing(tmp_path):
    devices.publish(tmp_path, "n1", 0, torch.device("cpu"))
    assert published(tmp_path, "n1") == []
    sample = Sampler(tmp_path, interval_s=3600, local_ranks=1).sample()  # the real library lookup, no GPU here
    assert "gpus" not in sample and "gpu_error" not in sample
    assert json.loads(next((tmp_path / "metrics").glob("node-*.jsonl")).read_text())["kind"] == "sample"
