"""Which transport the collective library really uses, and whether that is the fast one the cluster has.

The most common multi-node performance bug on LUMI-class systems: the network plugin (aws-ofi-rccl /
aws-ofi-nccl over libfabric, or IB verbs) is not found, and NCCL/RCCL silently falls back to TCP
sockets, many times slower. NCCL says which network it picked in its INFO log (``NCCL_DEBUG=INFO``):

    NCCL INFO Using network AWS Libfabric     (aws-ofi-nccl/-rccl: libfabric, e.g. Slingshot's CXI)
    NCCL INFO Using network IB                (InfiniBand verbs)
    NCCL INFO Using network Socket            (TCP: the fallback)
    NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0

A profile declares what it expects (``interconnect = "ofi"``, ``"ib"`` or ``"socket"``) and whether a
mismatch fails the job (``interconnect_required = true``) or only warns. gloo (CPU ranks) always talks TCP.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from trainscale.runtime.nccl import EXPECTED_NETWORK_VAR, transport_log

EXPECTED_VAR = EXPECTED_NETWORK_VAR
REQUIRED_VAR = "TRAINSCALE_INTERCONNECT_REQUIRED"
"""1: a multi-node job on another network stops at its start instead of warning."""
_USING = re.compile(r"NCCL INFO Using network (?P<net>.+?)\s*$")
_VIA = re.compile(r"via NET/(?P<net>[^/]+)")
_NO_PLUGIN = re.compile(r"NCCL INFO NET/Plugin.*(No plugin found|cannot open shared object|Could not find)", re.I)

FIXES = {
    "ofi": (
        "the libfabric network plugin (aws-ofi-rccl on LUMI, aws-ofi-nccl elsewhere) was not loaded: on LUMI "
        "load it (module use /appl/local/containers/ai-modules; module load singularity-AI-bindings, or the "
        "aws-ofi-rccl module), or bind it into the container and put its directory on LD_LIBRARY_PATH"
    ),
    "ib": (
        "NCCL found no InfiniBand device: check that the job's nodes have their HCAs (ibv_devinfo), that "
        "NCCL_IB_DISABLE is not set, and that the container sees /dev/infiniband (singularity --nv binds it)"
    ),
    "socket": "",
}


def kind_of(network: str) -> str:
    """NCCL's network name -> ofi, ib or socket (anything else: its lower-case name)."""
    name = network.strip().lower()
    if "libfabric" in name or "ofi" in name:
        return "ofi"
    if name.startswith("ib") or "verbs" in name:
        return "ib"
    if "socket" in name:
        return "socket"
    return name


@dataclass(frozen=True)
class Transport:
    networks: tuple[str, ...]
    """The network kinds the log shows being used (ofi, ib, socket), in order of appearance."""
    plugin_missing: bool
    """The log says the network plugin could not be loaded."""
    lines: tuple[str, ...]
    """The log lines the verdict rests on (for the report)."""


_INTRA = re.compile(r"via (?P<kind>P2P|SHM|NET)\b")


def intra_node_transports(text: str) -> tuple[str, ...]:
    """How NCCL connects its channels (``Channel 00/0 : 0[0] -> 1[1] via P2P/IPC``): P2P (NVLink or PCIe
    peer access), SHM (through host memory: P2P unavailable) or NET, in order of appearance."""
    return tuple(dict.fromkeys(match.group("kind") for match in _INTRA.finditer(text)))


def parse_nccl_log(text: str) -> Transport:
    networks: list[str] = []
    evidence: list[str] = []
    missing = False
    for line in text.splitlines():
        m = _USING.search(line) or _VIA.search(line)
        if m:
            kind = kind_of(m.group("net"))
            if kind not in networks:
                networks.append(kind)
                evidence.append(line.strip())
        if _NO_PLUGIN.search(line):
            missing = True
            evidence.append(line.strip())
    return Transport(tuple(networks), missing, tuple(evidence))


@dataclass(frozen=True)
class Verdict:
    level: str
    """ok, warning or error."""
    message: str
    hint: str = ""


def judge(
    transport: Transport, *, expected: str, multi_node: bool, required: bool = False, backend: str = "nccl"
) -> Verdict:
    """Whether the transport found suits the cluster: a multi-node NCCL/RCCL job on a profile that
    expects a fast network must not be on sockets."""
    if backend == "gloo":
        return Verdict("ok", "gloo (CPU ranks): TCP sockets, as expected for CPU tensors")
    if not transport.networks:
        return Verdict(
            "ok" if not multi_node else "warning",
            "no network transport in the log (single node: NCCL uses P2P/SHM within a node)"
            if not multi_node
            else "the NCCL log names no network transport",
            "" if not multi_node else "run with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET to see it",
        )
    used = ", ".join(transport.networks)
    if not expected or not multi_node:
        return Verdict("ok", f"network transport: {used}")
    if expected in transport.networks and "socket" not in transport.networks:
        return Verdict("ok", f"network transport: {used} (the profile expects {expected})")
    level = "error" if required else "warning"
    why = " (the network plugin could not be loaded)" if transport.plugin_missing else ""
    return Verdict(
        level,
        f"this multi-node job talks over {used}, not the cluster's fast network ({expected}){why}: "
        "every all-reduce crosses TCP sockets, several times slower",
        FIXES.get(expected, ""),
    )


def arm(environ: dict[str, str] | os._Environ, log_dir: Path) -> Path | None:
    """Before the process group exists: NCCL's INIT/NET lines to a file of this process (runtime/nccl.py)."""
    path = transport_log(environ, log_dir)
    return Path(path) if path else None


def check_file(path: Path, **kwargs) -> Verdict:
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        text = ""
    return judge(parse_nccl_log(text), **kwargs)
