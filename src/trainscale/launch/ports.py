"""Choose and check TCP ports for the rendezvous store: random, free, bound to the chosen interface."""

from __future__ import annotations

import socket

from trainscale.errors import LaunchError
from trainscale.runtime.store import resolve  # one resolver for launcher and runtime

__all__ = ["resolve", "free_port", "check_port_free", "parse_endpoint"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free on ``host`` right now (the kernel picks it at random)."""
    address = resolve(host)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def check_port_free(host: str, port: int) -> None:
    """Raise a LaunchError naming host and port when something already listens there."""
    address = resolve(host)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((address, port))
        except OSError as exc:
            raise LaunchError(f"port {port} on {host} ({address}) is not free: {exc.strerror}",
                              hint="leave --master-port/--rdzv-endpoint's port out to let trainscale pick a free one, "
                                   "or choose another port") from None


def parse_endpoint(endpoint: str, default_port: int = 29400) -> tuple[str, int]:
    """``host[:port]`` (IPv6 as ``[addr]:port``) -> (host, port)."""
    endpoint = endpoint.strip()
    if not endpoint:
        raise LaunchError("empty rendezvous endpoint", hint="give --rdzv-endpoint HOST:PORT")
    if endpoint.startswith("["):
        host, _, rest = endpoint[1:].partition("]")
        port_text = rest.lstrip(":")
    elif endpoint.count(":") == 1:
        host, port_text = endpoint.split(":")
    else:
        host, port_text = endpoint, ""
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        raise LaunchError(f"rendezvous endpoint {endpoint!r}: port {port_text!r} is not a number",
                          hint="write it as HOST:PORT, e.g. n1:29400") from None
    if not 0 < port < 65536:
        raise LaunchError(f"rendezvous endpoint {endpoint!r}: port {port} out of range", hint="use 1024-65535")
    return host, port
