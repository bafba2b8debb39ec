"""``trainscale bench allreduce``: how many ranks and nodes, then the measurement here or as one SLURM job
(also the plan's sweeps where the ranks run here)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from trainscale.bench.slurm_runs import SlurmTarget, prepare
from trainscale.bench.study import choose_out_dir
from trainscale.errors import ConfigError
from trainscale.launch.trial import here, on_slurm


def shape(
    *, nproc: int | None, gpus_per_node: int | None, nodes: str | None, target: SlurmTarget | None
) -> tuple[int, int]:
    """(ranks per node, nodes) from ``--nproc``/``--gpus-per-node``/``--nodes`` and the profile (default 2 x 1)."""
    if nproc is not None and gpus_per_node is not None:
        raise ConfigError("--nproc and --gpus-per-node both give ranks per node", hint="give one of them")
    nproc = nproc if nproc is not None else gpus_per_node
    if target is not None and nproc is None:
        nproc = target.nodes_ranks
        if nproc is None:
            raise ConfigError(
                f"profile {target.profile!r} has no GPUs per node to say how many ranks a node runs",
                hint="give --gpus-per-node R (ranks per node)",
            )
    nproc = 2 if nproc is None else nproc
    if nproc < 1:
        raise ConfigError(f"--nproc {nproc}: an all-reduce needs at least one rank", hint="e.g. --nproc 2")
    if target is None or nodes is None:
        return nproc, 1
    try:
        return nproc, int(nodes)
    except ValueError:
        raise ConfigError(f"--nodes {nodes!r} is not a number of nodes", hint="e.g. --nodes 2") from None


def measure(
    target: SlurmTarget | None,
    *,
    nproc: int,
    sizes: str,
    out_file: Path,
    logs: Path,
    iters: int,
    budget_s: float,
    nodes: int = 1,
    device: str = "auto",
    hook: str = "none",
    name: str = "bench-allreduce",
    say: Callable[[str], None] | None = None,
) -> dict:
    """Launch bench/allreduce.py like training, on ``nproc`` local ranks or as one SLURM job of ``nodes`` x
    ``nproc`` (linted before ``out_file``'s directory is made); its JSON, or ``{"error": why}``."""
    args = ("--sizes", sizes, "--iters", str(iters), "--budget", str(budget_s), "--device", device)
    if target is None:
        out_file.parent.mkdir(parents=True, exist_ok=True)
        done = here(
            "trainscale.bench.allreduce",
            (*args, "--hook", hook, "--out", str(out_file.absolute())),
            module=True,
            nproc=nproc,
            run_dir=logs,
        )
        return json.loads(out_file.read_text()) if done.ok else {"error": done.summary}

    job = target.job(
        name=name,
        nodes=nodes,
        ranks_per_node=nproc,
        output_dir=logs.absolute(),
        module="trainscale.bench.allreduce",
        command_line=("trainscale", "bench", "allreduce", "--slurm"),
        args=(*args, *(("--hook", hook) if hook != "none" else ()), "--out", str(out_file.absolute())),
    )
    prepared = prepare(target, {name: job})[name]  # linted before anything is written
    out_file.parent.mkdir(parents=True, exist_ok=True)
    done = on_slurm(prepared.spec, target.cluster, prepared.plan, poll_s=target.poll_s, say=say)
    if not done.ok:
        return {"error": done.summary}
    try:
        return json.loads(out_file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return {
            "error": f"job {done.job_id} completed but wrote no result to {out_file} ({exc}); is the output "
            "directory on a file system the compute nodes share?"
        }


def run(
    *,
    target: SlurmTarget | None,
    nproc: int,
    nodes: int,
    sizes: str,
    out: Path | None,
    iters: int,
    budget_s: float,
    device: str,
    hook: str,
    say: Callable[[str], None],
) -> tuple[dict | None, Path]:
    """Measure in a new directory (``out``, or bench-out/allreduce/<date-time>); (the result, its JSON file)."""
    out_dir = choose_out_dir(out, root=Path("bench-out") / "allreduce")
    out_file = out_dir / "allreduce.json"
    return measure(
        target,
        nproc=nproc,
        nodes=nodes,
        sizes=sizes,
        out_file=out_file,
        iters=iters,
        budget_s=budget_s,
        logs=out_dir / ("logs" if target is None else "job"),
        device=device,
        hook=hook,
        say=say,
    ), out_file
