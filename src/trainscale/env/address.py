"""Host names and the addresses they stand for (read-only: nothing is bound or changed here)."""

from __future__ import annotations

import socket

from trainscale.errors import LaunchError


def resolve(host: str) -> str:
    """The first address ``host`` resolves to; a LaunchError naming the host when it does not."""
    try:
        return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0]
    except socket.gaierror as exc:
        raise LaunchError(
            f"master address {host!r} does not resolve: {exc.strerror}",
            hint="use a host name of the allocation (first node) or an IP address; check /etc/hosts",
        ) from None
