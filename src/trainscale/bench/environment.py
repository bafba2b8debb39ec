"""Where a study ran: host, cores, CPU model, accelerator, versions (recorded in results.json)."""

from __future__ import annotations

import platform
import socket
from pathlib import Path


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "cpu model"):
            return value.strip()
    return platform.processor() or platform.machine()


def gpus() -> list[str]:
    import torch

    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def collect() -> dict:
    import torch

    from trainscale._version import __version__
    from trainscale.runtime.threads import usable_cores

    names = gpus()
    return {
        "host": socket.gethostname(),
        "cores": usable_cores(),
        "cpu": cpu_model(),
        "gpus": names,
        "device": names[0] if names else f"CPU ({cpu_model()})",
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "trainscale": __version__,
    }

