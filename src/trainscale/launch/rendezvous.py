"""torchrun's c10d and static rendezvous, with their store listening on the chosen address only.

PyTorch's TCPStore listens on every address of the host. Handing it a socket already bound to the
endpoint's address (``master_listen_fd``) keeps the store on that interface: loopback for a
single-node run (``--standalone``, or ``--master-addr 127.0.0.1``), the cluster network address of
the first node for a multi-node job.
"""

from __future__ import annotations

import contextlib
import datetime

from trainscale.errors import LaunchError
from trainscale.launch.ports import parse_endpoint, resolve, tcp_socket
from trainscale.runtime.store import bound_server

BACKEND = "trainscale-c10d"
STATIC = "trainscale-static"


def _is_local(address: str) -> bool:
    with tcp_socket(address) as probe:
        try:
            probe.bind((address, 0))
            return True
        except OSError:
            return False


def bound_store(host: str, port: int, timeout_s: int, is_host: bool | None):
    """The rendezvous store: the server bound to ``host`` only when we host it, else a client."""
    from torch.distributed import TCPStore  # noqa: PLC0415 (torch-free module)

    address = resolve(host)
    host_here = _is_local(address) if is_host is None else is_host
    timeout = datetime.timedelta(seconds=timeout_s)
    if host_here:
        try:
            return bound_server(host, port, timeout)
        except LaunchError:
            if is_host:  # told to host: a busy port is an error, reported by the caller's check
                raise
            # Another agent on this machine hosts it (several "nodes" on one host): join as a client.
    return TCPStore(host, port, is_master=False, multi_tenant=True, timeout=timeout)


def _create_handler(params):
    from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend  # noqa: PLC0415 (torch-free module)
    from torch.distributed.elastic.rendezvous.dynamic_rendezvous import create_handler  # noqa: PLC0415 (torch-free module)

    host, port = parse_endpoint(params.endpoint)
    store = bound_store(host, port, int(params.get_as_int("read_timeout", 60)), params.get_as_bool("is_host"))

    class BoundC10dBackend(C10dRendezvousBackend):
        @property
        def name(self) -> str:  # torch checks the handler reports the backend it was asked for
            return BACKEND

    handler = create_handler(store, BoundC10dBackend(store, params.run_id), params)
    # With store sharing on (a run without restarts: launch/local.py), node 0's agent starts one more
    # store for its workers' process group; bind it to this node's address too. With sharing off,
    # trainscale's runtime makes that store on rank 0, bound to the master address (runtime/store.py).
    handler._create_tcp_store_server = bound_server  # called as (master_addr, master_port)
    return handler


def _create_static_handler(params):
    """torch's static rendezvous (``--master-addr/--master-port/--node-rank``), node 0's store bound to
    the master address. The agents' store is the workers' too (torch's static rendezvous shares it)."""
    from torch.distributed import TCPStore  # noqa: PLC0415 (torch-free module)
    from torch.distributed.elastic.rendezvous.static_tcp_rendezvous import StaticTCPRendezvous, create_rdzv_handler  # noqa: PLC0415 (torch-free module)

    h = create_rdzv_handler(params)  # torch's own checks of rank, endpoint and port

    class BoundStaticRendezvous(StaticTCPRendezvous):
        def get_backend(self) -> str:  # torch checks the handler reports the backend it was asked for
            return STATIC

        def next_rendezvous(self):
            if not self._store:  # torch's would listen on every address
                if self.rank == 0:
                    self._store = bound_server(self.master_addr, self.master_port, self.timeout, self.world_size)
                else:
                    self._store = TCPStore(
                        self.master_addr, self.master_port, self.world_size, False, self.timeout, multi_tenant=True
                    )
            return super().next_rendezvous()

    return BoundStaticRendezvous(
        h.master_addr, h.master_port, h.rank, h.world_size, h.run_id, int(h.timeout.total_seconds())
    )


def register(backend: str = "c10d") -> str:
    """Make trainscale's bound variant of torch's ``c10d`` or ``static`` rendezvous known to torch's
    registry (idempotent); returns its name."""
    from torch.distributed.elastic.rendezvous import rendezvous_handler_registry as registry  # noqa: PLC0415 (torch-free module)

    name, create = (STATIC, _create_static_handler) if backend == "static" else (BACKEND, _create_handler)
    with contextlib.suppress(ValueError):  # already registered in this process
        registry.register(name, create)
    return name
