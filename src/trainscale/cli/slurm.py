"""`trainscale slurm`: render a batch script, lint it, submit it and watch it (parsing and printing only)."""

from __future__ import annotations

import argparse
import importlib
import sys
from pathlib import Path

from trainscale.errors import ConfigError

HELP = """usage: trainscale slurm (--workload NAME | -m MODULE | SCRIPT) [ARGS...]  -- with these options first:
         --profile P --nodes N --gpus-per-node G --time T
         [--account A] [--partition P] [--reservation R] [--mem-per-gpu M] [--cpus-per-gpu C]
         [--cpus-per-task C] [--ntasks-per-node N] [--cpu-bind B] [--container IMAGE]
         [--launcher torchrun|srun] [--job-name NAME] [--output-dir DIR] [--signal USR1@90] [--requeue]
         [--sbatch OPTION ...] [--env KEY=VALUE ...] [--python PATH] [--master-port P] [--dataloader-workers W]
         (--dry-run | --submit [--watch] [--poll S])

Options for trainscale come before the script; everything after the script (or the workload's
name) belongs to the script.

Examples:
  trainscale slurm --profile lumi --account project_465000000 --nodes 4 --time 02:00:00 --dry-run train.py --lr 3e-4
  trainscale slurm --profile local-test --nodes 2 --gpus-per-node 2 --time 00:10:00 --launcher srun \\
      --submit --watch --workload cnn --max-steps 20
"""

VALUE_FLAGS = ("--profile", "--nodes", "--gpus-per-node", "--time", "--account", "--partition", "--reservation",
               "--mem-per-gpu", "--cpus-per-gpu", "--cpus-per-task", "--ntasks-per-node", "--cpu-bind",
               "--container", "--launcher", "--job-name", "--output-dir", "--signal", "--sbatch", "--env",
               "--python", "--master-port", "--dataloader-workers", "--poll", "--watch-timeout")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="trainscale slurm", usage=HELP.removeprefix("usage: "), add_help=True)
    p.add_argument("--profile", default="generic-nvidia")
    p.add_argument("--nodes", type=int, default=1)
    p.add_argument("--gpus-per-node", type=int, default=None, help="on CPU-only profiles: ranks per node")
    p.add_argument("--time", default=None)
    p.add_argument("--account")
    p.add_argument("--partition")
    p.add_argument("--reservation")
    p.add_argument("--mem-per-gpu")
    p.add_argument("--cpus-per-gpu", type=int)
    p.add_argument("--cpus-per-task", type=int)
    p.add_argument("--ntasks-per-node", type=int)
    p.add_argument("--cpu-bind")
    p.add_argument("--container")
    p.add_argument("--launcher", choices=("torchrun", "srun"))
    p.add_argument("--job-name")
    p.add_argument("--output-dir", default="trainscale-jobs")
    p.add_argument("--signal")
    p.add_argument("--requeue", action="store_true")
    p.add_argument("--sbatch", action="append", default=[], help="an extra #SBATCH option, e.g. --constraint=a100")
    p.add_argument("--env", action="append", default=[], help="KEY=VALUE exported in the batch script")
    p.add_argument("--python")
    p.add_argument("--master-port", type=int)
    p.add_argument("--dataloader-workers", type=int, default=0)
    p.add_argument("--dry-run", action="store_true", help="print the batch script and the lint findings")
    p.add_argument("--submit", action="store_true", help="lint, write the script and sbatch it")
    p.add_argument("--watch", action="store_true", help="after --submit, follow the job to its end")
    p.add_argument("--poll", type=float, default=2.0, help="seconds between queue polls with --watch")
    p.add_argument("--watch-timeout", type=float, default=None)
    p.add_argument("--workload")
    p.add_argument("-m", "--module", dest="module")
    return p


def split_argv(argv: list[str]) -> tuple[list[str], list[str]]:
    """trainscale's options before the target; everything after the target belongs to the script."""
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok in ("--workload", "-m", "--module"):
            return argv[:i + 2], argv[i + 2:]
        if tok.startswith(("--workload=", "--module=")):
            return argv[:i + 1], argv[i + 1:]
        if tok in VALUE_FLAGS:
            i += 2
        elif tok.startswith("-"):
            i += 1
        else:
            return argv[:i + 1], argv[i + 1:]
    return argv, []


def build(argv: list[str]):
    """(spec, profile, namespace, preflight) from the command line."""
    from trainscale.launch.slurm import SlurmJobSpec
    from trainscale.profiles import load_profile

    own, script_args = split_argv(argv)
    parser = _parser()
    parser.add_argument("script", nargs="?")
    ns = parser.parse_args(own)
    if not ns.time:
        raise ConfigError("--time is required", hint="give the job's time limit, e.g. --time 01:00:00")
    env = {}
    for item in ns.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--env {item!r} is not KEY=VALUE", hint="e.g. --env NCCL_DEBUG=INFO")
        env[key] = value
    profile = load_profile(ns.profile)
    preflight = None
    if ns.workload:
        from trainscale.workloads.registry import get_workload

        preflight = getattr(importlib.import_module(get_workload(ns.workload).module), "preflight", None)
    spec = SlurmJobSpec(
        script=ns.script, module=ns.module, workload=ns.workload, args=tuple(script_args), profile=profile.name,
        nodes=ns.nodes, gpus_per_node=ns.gpus_per_node, time=ns.time, account=ns.account, partition=ns.partition,
        reservation=ns.reservation, mem_per_gpu=ns.mem_per_gpu, cpus_per_gpu=ns.cpus_per_gpu,
        cpus_per_task=ns.cpus_per_task, tasks_per_node=ns.ntasks_per_node, cpu_bind=ns.cpu_bind,
        container=ns.container, launcher=ns.launcher, job_name=ns.job_name, output_dir=Path(ns.output_dir),
        signal=ns.signal, requeue=ns.requeue, extra_sbatch=tuple(ns.sbatch), env=env, python=ns.python,
        master_port=ns.master_port, dataloader_workers=ns.dataloader_workers,
        command_line=("trainscale", "slurm", *argv),
    )
    return spec, profile, ns, preflight


def _print_findings(findings) -> None:
    for f in findings:
        print(f"trainscale slurm: {f}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from trainscale.launch.slurm import lint, render, resolve
    from trainscale.launch.slurm.lint import errors

    spec, profile, ns, preflight = build(args.argv)
    if ns.dry_run == ns.submit:
        raise ConfigError("give exactly one of --dry-run (print the script) or --submit (sbatch it)",
                          hint="start with --dry-run to read the script trainscale would submit")
    plan = resolve(spec, profile)
    findings = lint(spec, profile, plan, preflight=preflight)
    _print_findings(findings)
    if ns.dry_run:
        print(render(spec, profile, plan), end="")
        return 2 if errors(findings) else 0
    if errors(findings):
        print(f"trainscale slurm: {len(errors(findings))} error(s): not submitted", file=sys.stderr, flush=True)
        return 2
    return submit_and_watch(spec, profile, plan, ns)


def submit_and_watch(spec, profile, plan, ns) -> int:
    from trainscale.launch.slurm import explain, watch
    from trainscale.launch.slurm.job import submit_job
    from trainscale.launch.slurm.watch import describe_progress

    record = submit_job(spec, profile, plan)
    print(f"trainscale slurm: submitted job {record.job_id} ({plan.launcher} mode, world size {plan.world_size}); "
          f"script {record.script}; logs in {record.job_dir} (trainscale logs {record.job_id} [--rank R])",
          file=sys.stderr, flush=True)
    if not ns.watch:
        print(record.job_id, flush=True)  # alone on stdout, for scripts
        return 0

    def show(info) -> None:
        print(f"trainscale slurm: {describe_progress(info)}", file=sys.stderr, flush=True)

    final = watch(record.job_id, poll_s=ns.poll, timeout_s=ns.watch_timeout, on_change=show)
    print(explain(final, record), flush=True)
    return 0 if final.state == "COMPLETED" else 1


run_raw = run


def register(sub) -> None:
    p = sub.add_parser("slurm", help="render, lint, submit and watch a SLURM batch job (torchrun or srun mode)",
                       add_help=False, usage=HELP.removeprefix("usage: "))
    p.add_argument("argv", nargs=argparse.REMAINDER)
    p.set_defaults(func=run)
