"""Choose and check TCP ports for the rendezvous store: random, free, bound to the chosen interface.

Standard library only: a batch script runs ``main`` with any Python, a stock container's included
(the job kit, launch/kit.py), to print a port that is free on the job's first node, or to check the
``--port P`` it was given (docs/slurm.md, "The two launch modes": master port).
"""

from __future__ import annotations

import argparse
import importlib.util
import socket
import sys

from trainscale.env.address import resolve  # one resolver for launcher and runtime
from trainscale.errors import LaunchError

__all__ = ["resolve", "free_port", "check_port_free", "parse_endpoint", "choose", "importable", "main"]


def tcp_socket(address: str) -> socket.socket:
    """A TCP socket of the address's family (IPv6 when it has a colon)."""
    return socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_STREAM)


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says is free on ``host`` right now (the kernel picks it at random)."""
    address = resolve(host)
    with tcp_socket(address) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def check_port_free(host: str, port: int) -> None:
    """Raise a LaunchError naming host and port when something already listens there."""
    address = resolve(host)
    with tcp_socket(address) as sock:
        try:
            sock.bind((address, port))
        except OSError as exc:
            raise LaunchError(
                f"port {port} on {host} ({address}) is not free: {exc.strerror}",
                hint="leave --master-port/--rdzv-endpoint's port out to let trainscale pick a free one, "
                "or choose another port",
            ) from None


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
        raise LaunchError(
            f"rendezvous endpoint {endpoint!r}: port {port_text!r} is not a number",
            hint="write it as HOST:PORT, e.g. n1:29400",
        ) from None
    if not 0 < port < 65536:
        raise LaunchError(f"rendezvous endpoint {endpoint!r}: port {port} out of range", hint="use 1024-65535")
    return host, port


def choose(host: str, port: int | None = None) -> int:
    """``port`` after checking it is free on ``host``; a free one chosen by the kernel when None."""
    if port is None:
        port = free_port(host)
    check_port_free(host, port)
    return port


def importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None  # found, not imported: torch takes seconds to import
    except (ImportError, ValueError):
        return False


def main(argv: list[str] | None = None) -> int:
    from trainscale.errors import TrainscaleError  # noqa: PLC0415 (job kit)

    parser = argparse.ArgumentParser(prog="port.py", description="print a free rendezvous port on this host")
    parser.add_argument("--host", default="127.0.0.1", help="the master's address (this host)")
    parser.add_argument("--port", type=int, default=None, help="check this port instead of choosing one")
    parser.add_argument("--require", default="", help="comma list of modules this Python must be able to import")
    ns = parser.parse_args(argv)
    missing = [name for name in ns.require.split(",") if name and not importable(name)]
    if missing:
        print(
            f"trainscale: error: {sys.executable} (Python {sys.version.split()[0]}) cannot import {', '.join(missing)}",
            file=sys.stderr,
            flush=True,
        )
        return 3
    try:
        port = choose(ns.host, ns.port)
    except TrainscaleError as exc:
        print(f"trainscale: error: {exc}", file=sys.stderr, flush=True)
        return 1
    print(port, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
