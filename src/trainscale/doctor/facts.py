"""Read what the checks look at (versions, devices, affinity). The only part of doctor/ that probes the system
outside the network checks; the collect_* functions take these records, so tests can hand them made-up facts."""

from __future__ import annotations

import contextlib
import os
import platform
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field

from trainscale._version import __version__
from trainscale.topology import Topology, detect_topology

VISIBLE_VARS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")


@dataclass(frozen=True, kw_only=True)
class Versions:
    """Software versions; None where a package is not installed or could not be read."""

    trainscale: str
    """trainscale.__version__."""
    python: str
    """Python version (one line)."""
    executable: str
    """The interpreter running the doctor."""
    platform: str
    """OS and machine."""
    torch: str | None = None
    """torch.__version__."""
    torch_error: str | None = None
    """Why torch could not be imported."""
    cuda: str | None = None
    """torch.version.cuda: the CUDA torch was built with."""
    hip: str | None = None
    """torch.version.hip: the ROCm/HIP torch was built with."""
    nccl: str | None = None
    """NCCL (RCCL on ROCm) version torch links, when it can be read."""
    backends: tuple[str, ...] = ()
    """torch.distributed backends compiled in (gloo, nccl, mpi)."""
    packages: dict[str, str | None] = field(default_factory=dict)
    """Optional packages (deepspeed, transformers, ...) -> version or None."""


@dataclass(frozen=True, kw_only=True)
class Devices:
    """Accelerators as torch sees them, and the node as the topology tools see it."""

    accelerator: str
    """cuda, rocm or none: what torch can use."""
    names: tuple[str, ...] = ()
    """Name of each device torch sees."""
    memory_gib: tuple[float, ...] = ()
    """Total memory of each device, GiB."""
    visible: dict[str, str] = field(default_factory=dict)
    """CUDA_VISIBLE_DEVICES and friends, where set."""
    topology: Topology = field(default_factory=Topology)
    """What topology/ detected on this node."""
    error: str | None = None
    """Why torch could not report its devices."""


OPTIONAL_PACKAGES = ("deepspeed", "transformers", "accelerate", "numpy")


def _package_version(name: str) -> str | None:
    # Metadata, not import: a broken install must not break the report, and deepspeed imports slowly.
    from importlib import metadata  # noqa: PLC0415 (CLI start-up)

    try:
        return metadata.version(name)
    except Exception:  # PackageNotFoundError, or a corrupt dist-info
        return None


def read_versions() -> Versions:
    base = dict(
        trainscale=__version__,
        python=sys.version.split()[0] + f" ({platform.python_implementation()})",
        executable=sys.executable,
        platform=f"{platform.system()} {platform.release()} {platform.machine()}",
        packages={name: _package_version(name) for name in OPTIONAL_PACKAGES},
    )
    try:
        import torch  # noqa: PLC0415 (optional dependency)
    except Exception as exc:  # the report is most useful exactly when torch is broken
        return Versions(**base, torch_error=f"{type(exc).__name__}: {exc}")
    nccl, backends = None, ()
    with contextlib.suppress(Exception):  # None: not readable (no GPU, a build without it)
        if torch.cuda.is_available() or torch.version.cuda or torch.version.hip:
            raw = torch.cuda.nccl.version()
            nccl = ".".join(map(str, raw)) if isinstance(raw, tuple) else str(raw)
    with contextlib.suppress(Exception):
        import torch.distributed as dist  # noqa: PLC0415 (CLI start-up)

        if dist.is_available():
            checks = (
                ("gloo", dist.is_gloo_available),
                ("nccl", dist.is_nccl_available),
                ("mpi", dist.is_mpi_available),
            )
            backends = tuple(name for name, check in checks if check())
    return Versions(
        **base,
        torch=torch.__version__,
        cuda=torch.version.cuda,
        hip=getattr(torch.version, "hip", None),
        nccl=nccl,
        backends=backends,
    )


def read_devices(environ: Mapping[str, str] | None = None, topology: Topology | None = None) -> Devices:
    environ = os.environ if environ is None else environ
    visible = {k: environ[k] for k in VISIBLE_VARS if k in environ}
    topology = detect_topology() if topology is None else topology
    try:
        import torch  # noqa: PLC0415 (optional dependency)

        if not torch.cuda.is_available():
            return Devices(accelerator="none", visible=visible, topology=topology)
        count = torch.cuda.device_count()
        props = [torch.cuda.get_device_properties(i) for i in range(count)]
        return Devices(
            accelerator="rocm" if torch.version.hip else "cuda",
            names=tuple(p.name for p in props),
            memory_gib=tuple(round(p.total_memory / 2**30, 1) for p in props),
            visible=visible,
            topology=topology,
        )
    except Exception as exc:
        return Devices(accelerator="none", visible=visible, topology=topology, error=f"{type(exc).__name__}: {exc}")
