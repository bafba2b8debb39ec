"""The process group's key-value store, listening on the master address only.

torch's own TCPStore server listens on every address of the host. Handing it a socket already
bound to the master address (``master_listen_fd``) keeps it on the interface the job uses.
"""

from __future__ import annotations

import datetime
import socket

from trainscale.env.address import resolve
from trainscale.errors import LaunchError


def listening_socket(host: str, port: int) -> socket.socket:
    address = resolve(host)
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((address, port))
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise LaunchError(
            f"port {port} on {host} ({address}) is not free: {exc.strerror}",
            hint="leave the port out to let trainscale pick a free one, or choose another port",
        ) from None
    return sock


def bound_server(host: str, port: int, timeout: datetime.timedelta | None = None, world_size: int | None = None):
    """A TCPStore server listening on ``host``'s address only (``port`` 0: the kernel picks one).
    With ``world_size`` it returns once that many clients (itself included) have connected, as
    torch's static rendezvous waits for every node."""
    from torch.distributed import TCPStore  # noqa: PLC0415 (torch-free module)

    sock = listening_socket(host, port)
    kwargs = {"timeout": timeout} if timeout is not None else {}
    if world_size is not None:
        kwargs["world_size"] = world_size
    # The store's server takes the descriptor over and closes it with the last store using it.
    return TCPStore(
        host, sock.getsockname()[1], is_master=True, multi_tenant=True, master_listen_fd=sock.detach(), **kwargs
    )


def client(host: str, port: int, timeout: datetime.timedelta):
    from torch.distributed import TCPStore  # noqa: PLC0415 (torch-free module)

    return TCPStore(host, port, is_master=False, timeout=timeout)
