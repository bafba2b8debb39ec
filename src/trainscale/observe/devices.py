"""The job's own GPUs on a node, as NVML (nvidia-ml-py) and AMD SMI (amdsmi) name them.

Both libraries see every GPU of the node, whatever ``CUDA_VISIBLE_DEVICES`` says and however many of
them the job was given: averaging all of them reports a job on half a shared node as "GPU utilisation
~50%". So each local rank publishes which device it trains on (:func:`publish`: its UUID and PCI
address, as torch knows them) in ``metrics/devices/<host>/rank-<R>.json``, and the node's sampler
reads exactly those devices (:class:`JobGpus`), each sample labelled with its rank.

A device is found by UUID on NVIDIA GPUs and by PCI address on AMD ones (ROCm's UUIDs are empty on
some GCDs and shared by the two GCDs of an MI250X on others), and by PCI address wherever a UUID is
missing or shared. Values a library reports as "N/A" become None.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainscale.observe.records import metrics_dir

DEVICES = "devices"


def identity(device: torch.device) -> dict[str, Any] | None:
    """This rank's GPU: {"uuid", "pci"} (either may be None); None on a CPU."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    uuid = str(getattr(props, "uuid", "") or "").strip().lower().removeprefix("gpu-") or None
    try:
        pci = f"{props.pci_domain_id:04x}:{props.pci_bus_id:02x}:{props.pci_device_id:02x}.0"
    except AttributeError:  # an older torch
        pci = None
    return {"uuid": uuid, "pci": pci}


def publish(run_dir: str | Path, host: str, rank: int, device: torch.device) -> None:
    """This rank's device, for its node's sampler (a small file, written once, atomically)."""
    ident = identity(device)
    if ident is None:
        return
    directory = metrics_dir(run_dir) / DEVICES / host
    directory.mkdir(parents=True, exist_ok=True)
    tmp = directory / f".rank-{rank}.json.tmp"
    tmp.write_text(json.dumps({"rank": rank, **ident}))
    os.replace(tmp, directory / f"rank-{rank}.json")


def published(run_dir: str | Path, host: str) -> list[dict[str, Any]]:
    """What the node's ranks published so far, by rank."""
    directory = metrics_dir(run_dir) / DEVICES / host
    out = []
    for path in directory.glob("rank-*.json") if directory.is_dir() else ():
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted(out, key=lambda d: d["rank"])


def number(value: Any) -> float | None:
    """A reading as a float; None for what is not a number ("N/A", None, a dict)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        return None


class Nvml:
    """NVIDIA's library: devices by UUID (``GPU-...``), else PCI address."""

    prefer = "uuid"

    def __init__(self, pynvml: Any) -> None:
        self.lib = pynvml

    def by_uuid(self, uuid: str) -> Any:
        return self.lib.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")

    def by_pci(self, pci: str) -> Any:
        return self.lib.nvmlDeviceGetHandleByPciBusId_v2(pci)

    def read(self, handle: Any) -> dict[str, Any]:
        util = self.lib.nvmlDeviceGetUtilizationRates(handle)
        mem = self.lib.nvmlDeviceGetMemoryInfo(handle)
        try:
            power = number(self.lib.nvmlDeviceGetPowerUsage(handle))
        except Exception:  # not every board reports power
            power = None
        return {
            "util_pct": number(util.gpu),
            "mem_used": number(mem.used),
            "mem_total": number(mem.total),
            "power_w": power / 1000.0 if power is not None else None,
        }


class AmdSmi:
    """AMD's library: devices by PCI address (its UUIDs are not unique per GCD)."""

    prefer = "pci"

    def __init__(self, amdsmi: Any) -> None:
        self.lib = amdsmi

    def by_uuid(self, uuid: str) -> Any:
        for handle in self.lib.amdsmi_get_processor_handles():
            if str(self.lib.amdsmi_get_gpu_device_uuid(handle)).lower() == uuid:
                return handle
        raise LookupError(uuid)

    def by_pci(self, pci: str) -> Any:
        return self.lib.amdsmi_get_processor_handle_from_bdf(pci)

    def read(self, handle: Any) -> dict[str, Any]:
        activity = self.lib.amdsmi_get_gpu_activity(handle)
        vram = self.lib.amdsmi_get_gpu_vram_usage(handle)
        try:
            power = number(self.lib.amdsmi_get_power_info(handle).get("average_socket_power"))
        except Exception:
            power = None
        used, total = number(vram.get("vram_used")), number(vram.get("vram_total"))
        return {
            "util_pct": number(activity.get("gfx_activity")),
            "mem_used": used * 2**20 if used is not None else None,  # MiB
            "mem_total": total * 2**20 if total is not None else None,
            "power_w": power,
        }


def library() -> Nvml | AmdSmi | None:
    """The node's management library, initialised; None without one (or without a driver)."""
    try:
        import pynvml  # noqa: PLC0415 (optional dependency)

        pynvml.nvmlInit()
        return Nvml(pynvml)
    except Exception:  # not installed, or no NVIDIA driver here
        pass
    try:
        import amdsmi  # noqa: PLC0415 (optional dependency)

        amdsmi.amdsmi_init()
        return AmdSmi(amdsmi)
    except Exception:
        return None


def resolve(lib: Nvml | AmdSmi, devices: list[dict[str, Any]]) -> list[tuple[dict[str, Any], Any]]:
    """(identity, handle) per published device: by the library's preferred key, by the other where that
    is missing, shared by two ranks' devices or unknown to the library; devices found neither way are left out."""
    uuids = [d.get("uuid") for d in devices]
    out = []
    for device in devices:
        uuid, pci = device.get("uuid"), device.get("pci")
        unique = uuid if uuid and uuids.count(uuid) == 1 else None
        order = (("uuid", unique), ("pci", pci)) if lib.prefer == "uuid" else (("pci", pci), ("uuid", unique))
        for key, value in order:
            if not value:
                continue
            try:
                out.append((device, lib.by_uuid(value) if key == "uuid" else lib.by_pci(value)))
                break
            except Exception:
                continue
    return out


class JobGpus:
    """A sampler's GPU reader: the devices this node's ranks published, once all ``local_ranks`` have
    (until then, those published so far), each reading labelled with its rank."""

    def __init__(
        self, run_dir: str | Path, host: str, local_ranks: int, lib: Nvml | AmdSmi | None | Callable[[], Any] = library
    ) -> None:
        self.run_dir, self.host, self.local_ranks = run_dir, host, local_ranks
        self.lib = lib() if callable(lib) else lib
        self.handles: list[tuple[dict[str, Any], Any]] = []
        self._complete = False

    def __call__(self) -> list[dict[str, Any]]:
        if self.lib is None:
            return []
        if not self._complete:
            devices = published(self.run_dir, self.host)
            self._complete = len(devices) >= self.local_ranks
            self.handles = resolve(self.lib, devices)
        out = []
        for device, handle in self.handles:
            try:
                reading = self.lib.read(handle)
            except Exception as exc:  # a driver hiccup: say so for this device, go on with the others
                reading = {"error": str(exc)}
            out.append({"rank": device["rank"], "uuid": device.get("uuid"), "pci": device.get("pci"), **reading})
        return out
