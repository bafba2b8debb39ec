"""``python -m trainscale.workloads NAME [ARGS]``: what `trainscale run --workload NAME` starts on each rank."""

import importlib
import sys

from trainscale.workloads.registry import get_workload

if len(sys.argv) < 2:
    raise SystemExit("usage: python -m trainscale.workloads NAME [ARGS...]")
importlib.import_module(get_workload(sys.argv[1]).module).main(sys.argv[2:])
