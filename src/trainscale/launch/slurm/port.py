"""Print a rendezvous port that is free on this host (the job's first node), or check a given one.

The batch script runs this in the batch step, which SLURM starts on the allocation's first node, the
one that will host the store::

    MASTER_PORT=$(python -m trainscale.launch.slurm.port --host "$MASTER_ADDR")

With ``--port P`` the port is checked instead of chosen; a busy port ends the job before any rank
starts, with a message naming host and port.
"""

from __future__ import annotations

import argparse
import sys

from trainscale.errors import TrainscaleError
from trainscale.launch.ports import check_port_free, free_port


def choose(host: str, port: int | None = None) -> int:
    """``port`` after checking it is free on ``host``; a free one chosen by the kernel when None."""
    if port is None:
        port = free_port(host)
    check_port_free(host, port)
    return port


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainscale.launch.slurm.port", description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="the master's address (this host)")
    parser.add_argument("--port", type=int, default=None, help="check this port instead of choosing one")
    ns = parser.parse_args(argv)
    try:
        port = choose(ns.host, ns.port)
    except TrainscaleError as exc:
        print(f"trainscale: error: {exc}", file=sys.stderr, flush=True)
        return 1
    print(port, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
