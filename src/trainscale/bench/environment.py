"""Where a study ran: host, cores, CPU model, accelerator, versions (recorded in results.json)."""

from __future__ import annotations

import platform
import socket
from pathlib import Path

from trainscale._version import __version__


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` elsewhere)."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "cpu model"):
            return value.strip()
    return platform.processor() or platform.machine()


def collect() -> dict:
    import torch  # noqa: PLC0415 (torch-free module)

    from trainscale.runtime.threads import usable_cores  # noqa: PLC0415 (torch-free module)

    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count() if torch.cuda.is_available() else 0)]
    cpu = cpu_model()
    return {
        "host": socket.gethostname(),
        "cores": usable_cores(),
        "cpu": cpu,
        "gpus": gpus,
        "device": gpus[0] if gpus else f"CPU ({cpu})",
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "trainscale": __version__,
    }
