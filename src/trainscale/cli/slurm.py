"""`trainscale slurm`: render a batch script, lint it, submit it and watch it (parsing and printing only)."""

from __future__ import annotations

import argparse
import sys

from trainscale.errors import ConfigError

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

RESOLUTION = ("Each option resolves as defaults < profile < --config FILE ([slurm] table) < "
              "TRAINSCALE_SLURM_<OPTION> < the command line; a later source replaces the whole value.")


def _plain(group, *options: tuple[str, ...]) -> None:
    """Options that only take a string (their help comes from the SlurmJobSpec field)."""
    for flags in options:
        group.add_argument(*flags)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainscale slurm", usage=argparse.SUPPRESS, description=HELP,
                                epilog=RESOLUTION, formatter_class=argparse.RawDescriptionHelpFormatter,
                                argument_default=None)
    job = p.add_argument_group("the allocation (sbatch's options)")
    job.add_argument("-N", "--nodes", type=int)
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
    _plain(job, ("-e", "--error"), ("-d", "--dependency"), ("-a", "--array"), ("--mail-type",), ("--mail-user",),
           ("--export",), ("-D", "--chdir"))
    job.add_argument("--signal", help="warning before the time limit, e.g. USR1@90")
    job.add_argument("--requeue", action="store_const", const=True,
                     help="on the warning signal, checkpoint and requeue (at most --max-requeues times)")
    job.add_argument("--no-requeue", action="store_const", const=False, dest="requeue")
    job.add_argument("--max-requeues", type=int, metavar="K", help="requeues after which the job stops (default 3)")
    job.add_argument("--chain", type=int, metavar="N",
                     help="submit N jobs, each starting after the one before ends (afterany), resuming the run")
    job.add_argument("--sbatch", action="append", dest="extra_sbatch", metavar="OPTION",
                     help="any other #SBATCH option, e.g. --sbatch=--licenses=scratch")
    run = p.add_argument_group("the run")
    run.add_argument("--profile", help="cluster profile (trainscale profiles)")
    run.add_argument("--launcher", choices=("torchrun", "srun"))
    run.add_argument("--cpu-bind")
    run.add_argument("--gpu-visibility", choices=("auto", "task", "node"),
                     help="srun mode: each task sees its own GPU (task), all of the node's (node), or auto")
    run.add_argument("--module", action="append", dest="modules", metavar="LINE",
                     help="an environment-module line after the profile's, e.g. --module 'load PyTorch/2.1' "
                          "(repeatable); the job then runs the python3 the modules put on its PATH")
    run.add_argument("--no-profile-modules", action="store_const", const=False, dest="profile_modules",
                     help="leave out the profile's module lines (only --module's run)")
    run.add_argument("--setup", action="append", metavar="LINE", help="a shell line run before launch (repeatable)")
    run.add_argument("--env", action="append", metavar="KEY=VALUE", help="exported in the batch script")
    run.add_argument("--python", help="the Python the job runs (default: python3 after the module lines or in the "
                                      "container, else the one running trainscale); a bare name is looked up at job "
                                      "time")
    run.add_argument("--master-port", type=int)
    run.add_argument("--dataloader-workers", type=int)
    run.add_argument("--output-dir", help="where each submission's run directory goes (trainscale-jobs)")
    run.add_argument("--snapshot", metavar="DIR",
                     help="the directory copied into the run at submission (default: the script's project root: "
                          "the nearest directory with .git, pyproject.toml or setup.py); the job runs the copy")
    run.add_argument("--config", help="TOML file with a [slurm] table of these options")
    box = p.add_argument_group("containers")
    box.add_argument("--container", metavar="IMAGE")
    box.add_argument("--container-run", action="store_const", const="run", dest="container_mode",
                     help="start through the image's runscript (singularity run) instead of exec")
    box.add_argument("--container-setup", action="append", metavar="LINE",
                     help="a shell line run inside the container before Python, e.g. '$WITH_CONDA'")
    box.add_argument("--bind", action="append", dest="binds", metavar="SRC[:DST[:OPTS]]")
    act = p.add_argument_group("what to do")
    act.add_argument("--dry-run", action="store_true", help="print the script and the findings (and sbatch --test-only)")
    act.add_argument("--test-only", action="store_true", help="ask the scheduler (sbatch --test-only); submit nothing")
    act.add_argument("--submit", action="store_true", help="lint, write the script and sbatch it")
    act.add_argument("--watch", action="store_true", help="after --submit, follow the job to its end")
    act.add_argument("--poll", type=float, default=2.0, help="seconds between queue polls with --watch")
    act.add_argument("--watch-timeout", type=float, help="seconds --watch follows the job at most (default: until it ends)")
    act.add_argument("--workload", help=argparse.SUPPRESS)
    p.add_argument("script", nargs="?", help=argparse.SUPPRESS)
    from trainscale.config import field_docs
    from trainscale.launch.slurm.spec import SlurmJobSpec

    docs = field_docs(SlurmJobSpec)  # the job spec's field says what the option does: described once
    for action in p._actions:
        if not action.help and action.dest in docs:
            action.help = docs[action.dest].replace("``", "").replace("%", "%%")
    return p


_ACTIONS = ("dry_run", "test_only", "submit", "watch", "poll", "watch_timeout", "config", "script", "workload")


def build(argv: list[str], environ=None, *, extend=None, command: str = "slurm"):
    """(spec, profile, namespace, preflight) from the command line, config file and environment.

    ``extend(parser)`` adds a command's own options (``trainscale sweep``) and returns their dests, which
    are not job spec fields."""
    from trainscale.cli.split import split_command
    from trainscale.launch.slurm.sources import job_spec, spec_values
    from trainscale.workloads.registry import job_preflight

    parser = _parser()
    own = (*_ACTIONS, *(extend(parser) if extend else ()))
    split = split_command(parser, argv, target_options=("--workload", "-m"))
    ns = parser.parse_args(split.options)
    cli = spec_values({k: v for k, v in vars(ns).items() if k not in own and v is not None})
    target = {"--workload": "workload", "-m": "module"}.get(split.target_option, "script")
    if split.target:
        cli[target] = split.target
    cli |= {"args": tuple(split.rest), "command_line": ("trainscale", command, *argv)}
    spec, profile = job_spec(cli, config_file=ns.config, environ=environ)
    return spec, profile, ns, job_preflight(spec)


def _say(line: str) -> None:
    print(f"trainscale slurm: {line}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    import os

    from trainscale.launch.slurm import render
    from trainscale.launch.slurm.lint import errors
    from trainscale.launch.slurm.sources import check

    spec, profile, ns, preflight = build(args.argv, os.environ)
    if ns.watch and spec.chain > 1:
        raise ConfigError("--watch follows one job; a chain is several",
                          hint="follow it with `trainscale jobs` (a chain is one line there) and `trainscale logs JOBID`")
    if [ns.dry_run, ns.submit, ns.test_only].count(True) != 1:
        raise ConfigError("give exactly one of --dry-run (print the script), --test-only (ask the scheduler) or "
                          "--submit (sbatch it)", hint="start with --dry-run to read the script trainscale would submit")
    plan, findings = check(spec, profile, preflight=preflight)
    for f in findings:
        _say(str(f))
    if ns.dry_run or ns.test_only:
        text = render(spec, profile, plan)
        if ns.dry_run:
            print(text, end="")
        answer = _ask_scheduler(text, required=ns.test_only)
        if errors(findings):
            return 2
        return 1 if ns.test_only and answer != "accepts" else 0
    if errors(findings):
        _say(f"{len(errors(findings))} error(s): not submitted")
        return 2
    return submit_and_watch(spec, profile, plan, ns)


def _ask_scheduler(text: str, *, required: bool) -> str:
    """sbatch --test-only: when and where SLURM would start the job (nothing is submitted). Returns
    ``accepts``, ``refuses``, ``unreachable`` or ``no sbatch``."""
    from trainscale.launch.slurm.submit import ask_test_only

    answer, said = ask_test_only(text, required=required)
    if answer == "unreachable":
        _say(f"could not ask the scheduler (sbatch --test-only: {said}); the job was not checked by SLURM")
        print("  hint: run it where the SLURM controller answers (a login node; `squeue` works there)",
              file=sys.stderr, flush=True)
    elif answer != "no sbatch":
        _say(f"sbatch --test-only {'accepts' if answer == 'accepts' else 'REFUSES'} the job: {said}")
    return answer


def submit_and_watch(spec, profile, plan, ns) -> int:
    from trainscale.launch.slurm import explain, watch
    from trainscale.launch.slurm.job import submit_job
    from trainscale.launch.slurm.watch import describe_progress

    record = submit_job(spec, profile, plan)
    chain = f"chain of {spec.chain} jobs from " if spec.chain > 1 else ""
    _say(f"submitted {chain}job {record.job_id} ({plan.launcher} mode, world size {plan.world_size}); run directory "
         f"{record.run_dir} (trainscale logs {record.job_id} [--rank R])")
    if not ns.watch:
        print(record.job_id, flush=True)  # alone on stdout, for scripts
        return 0
    final = watch(record.job_id, poll_s=ns.poll, timeout_s=ns.watch_timeout,
                  on_change=lambda info: _say(describe_progress(info)))
    print(explain(final, record), flush=True)
    return 0 if final.state == "COMPLETED" else 1


def register(sub) -> None:
    p = sub.add_parser("slurm", help="render, lint, submit and watch a SLURM batch job (torchrun or srun mode)",
                       add_help=False)
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p.set_defaults(func=run, raw=True)
