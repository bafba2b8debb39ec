"""``trainscale bench allreduce``: how many ranks and nodes, then the measurement here or as one SLURM job."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from trainscale.bench.slurm_runs import SlurmTarget
from trainscale.errors import ConfigError


def shape(*, nproc: int | None, gpus_per_node: int | None, nodes: str | None,
          target: SlurmTarget | None) -> tuple[int, int]:
    """(ranks per node, nodes) from ``--nproc``/``--gpus-per-node``/``--nodes`` and the profile (default 2 x 1)."""
    if nproc is not None and gpus_per_node is not None:
        raise ConfigError("--nproc and --gpus-per-node both give ranks per node", hint="give one of them")
    nproc = nproc if nproc is not None else gpus_per_node
    if target is not None and nproc is None:
        nproc = target.nodes_ranks
        if nproc is None:
            raise ConfigError(f"profile {target.profile!r} has no GPUs per node to say how many ranks a node runs",
                              hint="give --gpus-per-node R (ranks per node)")
    nproc = 2 if nproc is None else nproc
    if nproc < 1:
        raise ConfigError(f"--nproc {nproc}: an all-reduce needs at least one rank", hint="e.g. --nproc 2")
    if target is None or nodes is None:
        return nproc, 1
    try:
        return nproc, int(nodes)
    except ValueError:
        raise ConfigError(f"--nodes {nodes!r} is not a number of nodes", hint="e.g. --nodes 2") from None


def run(*, target: SlurmTarget | None, nproc: int, nodes: int, sizes: str, out: Path | None, iters: int,
        budget_s: float, device: str, hook: str, say: Callable[[str], None]) -> tuple[dict | None, Path]:
    """Measure in a new directory (``out``, or bench-out/allreduce/<date-time>); (the result, its JSON file)."""
    from trainscale.bench.study import choose_out_dir

    out_dir = choose_out_dir(out, root=Path("bench-out") / "allreduce")
    out_file = out_dir / "allreduce.json"
    if target is None:
        from trainscale.bench.runner import measure_allreduce

        out_dir.mkdir(parents=True, exist_ok=True)
        return measure_allreduce(nproc, sizes, out_file, out_dir / "logs", iters=iters, budget_s=budget_s,
                                 device=device, hook=hook), out_file
    from trainscale.bench.slurm_runs import allreduce_job, measure_allreduce

    job = allreduce_job(target, nodes=nodes, ranks_per_node=nproc, sizes=sizes, out_file=out_file.absolute(),
                        output_dir=out_dir / "job", iters=iters, budget_s=budget_s, device=device,
                        name="bench-allreduce", hook=hook)  # linted before anything is written
    out_dir.mkdir(parents=True, exist_ok=True)
    return measure_allreduce(target, job, out_file, on_line=say), out_file
