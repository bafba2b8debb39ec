"""`trainscale slurm`'s options (shared by `trainscale sweep`): sbatch's spelling where sbatch has one, the
help of an option without its own from the SlurmJobSpec field it sets."""

from __future__ import annotations

import argparse

HELP = """usage: trainscale slurm [OPTIONS] (SCRIPT | -m MODULE | --workload NAME) [ARGS...]

trainscale's options come first, in sbatch's spelling where sbatch has one; everything after the script
(or -m MODULE / --workload NAME) belongs to the script. One of --dry-run, --test-only or --submit.

Examples:
  trainscale slurm --profile lumi -A project_465000000 -N 4 -t 02:00:00 --dry-run train.py --lr 3e-4
  trainscale slurm --profile lumi -A project_465000000 -N 2 -t 1:00:00 -p standard-g \\
      --container $SIF --container-setup '$WITH_CONDA' --submit cnn_multinode.py --epochs 5
  trainscale slurm --profile cyclone -N 2 --gpus-per-node 2 -t 01:00:00 --launcher srun \\
      --module 'load PyTorch/2.1.2-foss-2023a-CUDA-12.1.1' --submit --watch cnn_multinode.py
  trainscale slurm --profile local-test -N 2 --gpus-per-node 2 -t 00:10:00 --launcher srun \\
      --submit --watch --workload cnn --max-steps 20
  trainscale slurm --config job.toml --submit train.py      # [slurm] table: any option below, by field name
"""

RESOLUTION = (
    "Each option resolves as defaults < profile < --config FILE ([slurm] table) < "
    "TRAINSCALE_SLURM_<OPTION> < the command line; a later source replaces the whole value."
)


def _plain(group, *options: tuple[str, ...]) -> None:
    """Options that only take a string (their help comes from the SlurmJobSpec field)."""
    for flags in options:
        group.add_argument(*flags)


def parser() -> argparse.ArgumentParser:
    from trainscale.config.argparsing import Parser  # noqa: PLC0415 (CLI start-up)

    p = Parser(
        prog="trainscale slurm",
        usage=argparse.SUPPRESS,
        description=HELP,
        epilog=RESOLUTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        argument_default=None,
    )
    job = p.add_argument_group("the allocation (sbatch's options)")
    job.add_argument(
        "-N",
        "--nodes",
        metavar="N|MIN-MAX",
        help="nodes; MIN-MAX: when a node fails, continue on the others down to MIN (docs/slurm.md)",
    )
    job.add_argument(
        "--spare-nodes",
        type=int,
        metavar="K",
        help="also allocate K spare nodes; a failed node's part restarts on one at once",
    )
    job.add_argument("--gpus-per-node", metavar="[TYPE:]N", help="GPUs per node (CPU-only profiles: ranks per node)")
    job.add_argument("-n", "--ntasks", type=int, help="total ranks (with --nodes: ranks per node)")
    job.add_argument("-t", "--time", help="time limit, any sbatch form (MM, HH:MM:SS, D-HH:MM, UNLIMITED...)")
    _plain(job, ("-A", "--account"), ("-p", "--partition"), ("-q", "--qos"), ("-C", "--constraint"), ("--reservation",))
    job.add_argument("--exclusive", action="store_const", const=True)
    job.add_argument("--mem", help="memory per node, e.g. 400G")
    job.add_argument("--mem-per-gpu")
    job.add_argument("--cpus-per-gpu", type=int)
    job.add_argument("-c", "--cpus-per-task", type=int)
    job.add_argument("--ntasks-per-node", type=int, dest="tasks_per_node")
    _plain(job, ("--gpu-bind",), ("-J", "--job-name"))
    job.add_argument("-o", "--output", help="the batch step's output file (sbatch patterns: %%j %%x ...)")
    _plain(
        job,
        ("-e", "--error"),
        ("-d", "--dependency"),
        ("-a", "--array"),
        ("--mail-type",),
        ("--mail-user",),
        ("--export",),
        ("-D", "--chdir"),
    )
    job.add_argument("--signal", help="warning before the time limit, e.g. USR1@90")
    job.add_argument(
        "--requeue",
        action="store_const",
        const=True,
        help="on the warning signal, checkpoint and requeue (at most --max-requeues times)",
    )
    job.add_argument("--no-requeue", action="store_const", const=False, dest="requeue")
    job.add_argument("--max-requeues", type=int, metavar="K", help="requeues after which the job stops (default 3)")
    job.add_argument(
        "--chain",
        type=int,
        metavar="N",
        help="submit N jobs, each starting after the one before ends (afterany), resuming the run",
    )
    job.add_argument(
        "--sbatch",
        action="append",
        dest="extra_sbatch",
        metavar="OPTION",
        help="any other #SBATCH option, e.g. --sbatch=--licenses=scratch",
    )
    run = p.add_argument_group("the run")
    run.add_argument("--profile", help="cluster profile (trainscale profiles)")
    run.add_argument("--launcher", choices=("torchrun", "srun"))
    run.add_argument("--cpu-bind")
    run.add_argument(
        "--gpu-visibility",
        choices=("auto", "task", "node"),
        help="srun mode: each task sees its own GPU (task), all of the node's (node), or auto",
    )
    run.add_argument(
        "--module",
        action="append",
        dest="modules",
        metavar="LINE",
        help="an environment-module line after the profile's, e.g. --module 'load PyTorch/2.1' "
        "(repeatable); the job then runs the python3 the modules put on its PATH",
    )
    run.add_argument(
        "--no-profile-modules",
        action="store_const",
        const=False,
        dest="profile_modules",
        help="leave out the profile's module lines (only --module's run)",
    )
    run.add_argument("--setup", action="append", metavar="LINE", help="a shell line run before launch (repeatable)")
    run.add_argument("--env", action="append", metavar="KEY=VALUE", help="exported in the batch script")
    run.add_argument(
        "--hang-timeout",
        type=float,
        metavar="S",
        help="end the job after S seconds with no progress on any rank, naming the hung rank (exit "
        "status 124; 0: never; default: 600, counted once training steps ran)",
    )
    run.add_argument(
        "--python",
        help="the Python the job runs (default: python3 after the module lines or in the "
        "container, else the one running trainscale); a bare name is looked up at job "
        "time",
    )
    run.add_argument("--master-port", type=int)
    run.add_argument("--dataloader-workers", type=int)
    run.add_argument("--output-dir", help="where each submission's run directory goes (trainscale-jobs)")
    run.add_argument(
        "--snapshot",
        metavar="DIR",
        help="the directory copied into the run at submission (default: the script's project root: "
        "the nearest directory with .git, pyproject.toml or setup.py); the job runs the copy",
    )
    run.add_argument("--config", help="TOML file with a [slurm] table of these options")
    box = p.add_argument_group("containers")
    box.add_argument("--container", metavar="IMAGE")
    box.add_argument(
        "--container-run",
        action="store_const",
        const="run",
        dest="container_mode",
        help="start through the image's runscript (singularity run) instead of exec",
    )
    box.add_argument(
        "--container-setup",
        action="append",
        metavar="LINE",
        help="a shell line run inside the container before Python, e.g. '$WITH_CONDA'",
    )
    box.add_argument("--bind", action="append", dest="binds", metavar="SRC[:DST[:OPTS]]")
    act = p.add_argument_group("what to do")
    act.add_argument(
        "--dry-run", action="store_true", help="print the script and the findings (and sbatch --test-only)"
    )
    act.add_argument("--test-only", action="store_true", help="ask the scheduler (sbatch --test-only); submit nothing")
    act.add_argument("--submit", action="store_true", help="lint, write the script and sbatch it")
    act.add_argument("--watch", action="store_true", help="after --submit, follow the job to its end")
    act.add_argument("--poll", type=float, default=2.0, help="seconds between queue polls with --watch")
    act.add_argument(
        "--watch-timeout", type=float, help="seconds --watch follows the job at most (default: until it ends)"
    )
    act.add_argument("--workload", help=argparse.SUPPRESS)
    p.add_argument("script", nargs="?", help=argparse.SUPPRESS)
    from trainscale.config import field_docs  # noqa: PLC0415 (CLI start-up)
    from trainscale.launch.slurm.spec import SlurmJobSpec  # noqa: PLC0415 (CLI start-up)

    docs = field_docs(SlurmJobSpec)  # the job spec's field says what the option does: described once
    for action in p._actions:
        if not action.help and action.dest in docs:
            action.help = docs[action.dest].replace("``", "").replace("%", "%%")
    return p


# The dests that are not SlurmJobSpec fields: what to do with the job, not what it is.
ACTIONS = ("dry_run", "test_only", "submit", "watch", "poll", "watch_timeout", "config", "script", "workload")
