"""What each worker runs first: apply its CPU set, then the user's script or module under ``@record``.

``@record`` writes the worker's traceback to TORCHELASTIC_ERROR_FILE (set per rank by the elastic
agent), so a failure summary can show it without the user decorating their own main().
"""

from __future__ import annotations

import os
import runpy
import sys

from torch.distributed.elastic.multiprocessing.errors import record

BIND_VAR = "TRAINSCALE_CPU_BIND"
"""Per-local-rank CPU lists, ';'-separated: '0-3;4-7' gives local rank 1 the cores 4-7."""


def apply_bind_from_env() -> None:
    spec = os.environ.get(BIND_VAR)
    if not spec:
        return
    from trainscale.topology.apply import apply_cpu_binding
    from trainscale.topology.cpus import parse_cpulist

    lists = spec.split(";")
    local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")))
    if local_rank < len(lists) and lists[local_rank].strip():
        apply_cpu_binding(parse_cpulist(lists[local_rank]))


@record
def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] not in ("--script", "--module"):
        raise SystemExit("usage: python -m trainscale.launch.bootstrap (--script PATH | --module NAME) [ARGS...]")
    kind, target, args = argv[0], argv[1], argv[2:]
    apply_bind_from_env()
    sys.argv = [target, *args]
    if kind == "--module":
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
        runpy.run_path(target, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
