"""torchrun's own command line, reused: `trainscale run` accepts exactly what the installed torch's
``torchrun`` accepts (both spellings, ``PET_*`` fallbacks), because it is torch's parser.

trainscale adds a few options of its own (:func:`parser` lists them) and changes a few defaults; a
torchrun option the user gives always wins over trainscale's default (:func:`given`).
"""

from __future__ import annotations

import argparse

from trainscale.errors import ConfigError
from trainscale.topology.apply import current_affinity

LOGGING_OPTIONS = frozenset({"redirects", "tee", "local_ranks_filter", "logs_specs"})
"""Giving any of these switches trainscale's console (rank 0 shown, every rank teed to a file) off:
torchrun's meaning of all of them applies."""

EPILOG = """trainscale run is torchrun with trainscale's defaults; a torchrun option you give wins.
Differences from torchrun when you give no option for them (docs/launch.md has the table):
  console       rank 0's output on the console, every rank's stdout/stderr in the run's directory
                (one per run under --log-dir, default ./trainscale-runs, with its records; `trainscale
                report DIR` reads it); --redirects/--tee/--local-ranks-filter switch to torchrun's
                behaviour, --all-ranks shows every rank prefixed [rankN]:
  rendezvous    a single-node run gets a free port on 127.0.0.1; a store listens on the address
                you give only (torchrun: all addresses)
  threads       OMP_NUM_THREADS = cores / ranks when unset (torchrun: 1)
  failures      one summary: first failing rank, host, exit code or signal, its traceback
                (no @record needed), the other ranks' state
  workers       every worker gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
                MASTER_PORT, NODE_RANK and SLURM_PROCID/SLURM_LOCALID/SLURM_NTASKS/... that agree
  signals       SIGUSR1/SIGUSR2 (SLURM's warnings) are passed on to the workers
                (--signals-to-handle SIGUSR1 makes the agent stop them instead, as torchrun does);
                Ctrl-C/SIGTERM/SIGHUP stop the workers: one line, exit status 128+signal
  exit          a script that returned exits 0 (never torch's abort at interpreter exit); the
                workers die with the launcher, even a SIGKILLed one
  restarts      --max-restarts N: each restart is one line (rank, cause, attempt, checkpoint)

Examples:
  trainscale run --nproc-per-node 2 --workload cnn --epochs 5 --batch-size 16 --lr 0.001
  trainscale run --standalone --nnodes 1 --nproc-per-node gpu --redirects 3 --log-dir ../logs train_llm.py
  trainscale run --nnodes 2 --nproc-per-node 4 --rdzv-backend c10d --rdzv-endpoint node1:29400 --rdzv-id job42 \\
      -m mypkg.train
"""


def parser() -> argparse.ArgumentParser:
    """torch's ``torchrun`` parser plus trainscale's options; the target is optional (``--workload``)."""
    from torch.distributed.run import get_args_parser  # noqa: PLC0415 (torch-free module)

    p = get_args_parser()
    p.prog = "trainscale run"
    p.description = "Launch a script, module or built-in workload on N ranks per node (torchrun-compatible)."
    p.epilog = EPILOG
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    for action in p._actions:  # the script is optional here: `--workload NAME` may name the target instead
        if action.dest == "training_script":
            action.nargs, action.required, action.default = "?", False, None
        elif action.dest == "training_script_args":
            action.help = argparse.SUPPRESS
    own = p.add_argument_group("trainscale")
    own.add_argument(
        "--workload",
        default=None,
        metavar="NAME",
        help="run a built-in workload (listed below) instead of a script; its options follow",
    )
    own.add_argument(
        "--all-ranks",
        action="store_true",
        help="show every rank's output on the console, prefixed [rankN]: (default: rank 0 only)",
    )
    own.add_argument(
        "--rdzv-timeout",
        type=int,
        default=900,
        metavar="S",
        help="seconds to wait for every node at the rendezvous (rdzv-conf timeout/join_timeout win)",
    )
    own.add_argument(
        "--hang-timeout",
        type=float,
        default=None,
        metavar="S",
        help="end the job after S seconds with no progress on any rank, naming the hung rank (exit "
        "status 124; 0: never; default: 600, counted once training steps ran)",
    )
    return p


def defaults() -> argparse.Namespace:
    """Every torchrun option at its default (``PET_*`` variables included), trainscale's options too."""
    return parser().parse_args([])


def resolve_nproc(value: str | int) -> int:
    """``--nproc-per-node`` as torchrun reads it: N, or auto/cpu/gpu/xpu (torch's own rules), checked here
    so a bad value is refused with its fix before any process starts."""
    text = str(value).strip()
    try:
        n = int(text)
    except ValueError:
        pass
    else:
        if n < 1:
            raise ConfigError(
                f"--nproc-per-node {n}: at least one process per node is needed",
                hint="use --nproc-per-node 1 or more, or gpu (one per visible GPU)",
            )
        return n
    if text == "gpu":
        import torch  # noqa: PLC0415 (torch-free module)

        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            raise ConfigError(
                "--nproc-per-node gpu but no GPU is visible",
                hint="give a number of CPU processes (e.g. --nproc-per-node 2) or cpu (one per core)",
            )
    from torch.distributed.run import determine_local_world_size  # noqa: PLC0415 (torch-free module)

    try:
        return int(determine_local_world_size(text))
    except ValueError:
        raise ConfigError(
            f"--nproc-per-node {value!r} is not a number or one of auto, cpu, gpu, xpu",
            hint="use a positive integer, gpu (one per GPU), cpu (one per core) or auto",
        ) from None


def nproc_fits(n: int, given: str | int) -> str | None:
    """N ranks against this node: above its visible GPUs, a number is refused (rank N would get no GPU: each rank
    takes ``cuda:{local_rank}``); above its cores, a warning line (returned) says they share them."""
    import torch  # noqa: PLC0415 (torch-free module)

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus and str(given).strip().isdigit() and n > gpus:
        raise ConfigError(
            f"--nproc-per-node {n} but this node shows {gpus} GPU(s): local rank {gpus} and above would have none",
            hint=f"use --nproc-per-node gpu ({gpus}), or hide the GPUs (CUDA_VISIBLE_DEVICES=) to run CPU ranks",
        )

    cores = len(current_affinity()) or 1
    if not gpus and n > cores:
        return (
            f"warning: {n} ranks on {cores} core(s): they take turns on the cores, so each step is slower than "
            f"with {cores} rank(s), and a scaling figure from this run measures the sharing"
        )
    return None


def check_ranks_filter(value: str | None) -> None:
    """``--local-ranks-filter``: comma-separated local ranks (torchrun itself fails on anything else mid-launch)."""
    if value and not all(part.strip().isdigit() for part in value.split(",")):
        raise ConfigError(
            f"--local-ranks-filter {value!r} is not a list of local ranks",
            hint="write them comma-separated, e.g. --local-ranks-filter 0,1",
        )
