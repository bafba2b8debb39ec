"""Render a batch script from a spec and a profile. Pure: same inputs, same text (golden-file tested).

Every number comes from the :class:`~trainscale.launch.slurm.spec.JobPlan`; inside the script, srun
reads the allocation back from ``$SLURM_*`` variables instead of repeating numbers.
"""

from __future__ import annotations

import re
import shlex
import sys
from pathlib import Path

from trainscale._version import __version__
from trainscale.launch.slurm.spec import JobPlan, SlurmJobSpec, format_time, resolve
from trainscale.profiles import slurm_cpu_bind, worker_bind_env
from trainscale.profiles.schema import ClusterProfile

ERROR_DIR_VAR = "TRAINSCALE_ERROR_DIR"
EXPORT_TORCHRUN_VAR = "TRAINSCALE_EXPORT_TORCHRUN_ENV"
JOB_DIR_VAR = "TRAINSCALE_JOB_DIR"


def job_dir_pattern(spec: SlurmJobSpec, plan: JobPlan) -> str:
    """The per-job directory, with ``%j`` for the job id."""
    return str(plan.output_dir / f"{spec.name}-%j")


def batch_output_pattern(spec: SlurmJobSpec, plan: JobPlan) -> str:
    # The batch step's own output lives beside the job directory, not in it: slurmd opens this
    # file before the script runs, so its directory must already exist (trainscale creates
    # output_dir at submission; the job directory only exists once the script has made it).
    return str(plan.output_dir / f"{spec.name}-%j.out")


def python_of(spec: SlurmJobSpec) -> str:
    if spec.python:
        return spec.python
    return "python3" if spec.container else sys.executable


def _q(value: str | Path) -> str:
    return shlex.quote(str(value))


def _dq(value: str) -> str:
    """Double-quote a value for ``export``: ``${VAR}`` still expands (profiles rely on it), nothing else does."""
    if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", value):
        return value
    return '"' + re.sub(r'([\\"`])', r"\\\1", value).replace("$(", "\\$(") + '"'


def _cont(lines: list[str], indent: str = "    ") -> str:
    """Join command pieces into a multi-line shell command with backslash continuations."""
    return (" \\\n" + indent).join(lines)


def sbatch_lines(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan) -> list[str]:
    opts = [f"--job-name={spec.name}", f"--nodes={spec.nodes}", f"--ntasks-per-node={plan.tasks_per_node}"]
    if plan.cpus_per_task:
        opts.append(f"--cpus-per-task={plan.cpus_per_task}")
    if plan.gpus_per_node:
        opts.append(f"--gpus-per-node={plan.gpus_per_node}")
    if spec.cpus_per_gpu:
        opts.append(f"--cpus-per-gpu={spec.cpus_per_gpu}")
    if plan.mem_per_gpu:
        opts.append(f"--mem-per-gpu={plan.mem_per_gpu}")
    if plan.mem_per_node:
        opts.append(f"--mem={plan.mem_per_node}")
    opts.append(f"--time={format_time(plan.time_s)}")
    for flag, value in (("partition", plan.partition), ("account", spec.account), ("reservation", spec.reservation)):
        if value:
            opts.append(f"--{flag}={value}")
    signal = warning_signal(spec)
    if signal:
        opts.append(f"--signal={signal}")
    opts.append("--requeue" if spec.requeue else "--no-requeue")
    opts.append(f"--output={batch_output_pattern(spec, plan)}")
    opts.extend(line.strip() for line in spec.extra_sbatch)
    return [f"#SBATCH {o}" for o in opts]


def container_prefix(spec: SlurmJobSpec, profile: ClusterProfile) -> list[str]:
    if not spec.container:
        return []
    c = profile.container
    runtime = c.runtime if c else "singularity"
    words = [runtime, "exec"]
    if c and c.binds:
        words += ["-B", ",".join(c.binds)]
    if c and c.flags:
        words += list(c.flags)
    elif not c:
        words += {"nvidia": ["--nv"], "amd": ["--rocm"]}.get(profile.gpu_vendor, [])
    return [" ".join(_q(w) for w in words) + " " + _q(spec.container)]


def target_args(spec: SlurmJobSpec, launcher: str) -> list[str]:
    """What to run, in the form the launcher takes."""
    if launcher == "torchrun":  # `trainscale run` options
        if spec.workload:
            head = ["--workload", spec.workload]
        elif spec.module:
            head = ["-m", spec.module]
        else:
            head = [str(Path(spec.script or "").absolute())]
    else:  # bootstrap's options: the workloads' dispatcher takes the name as its first argument
        if spec.workload:
            head = ["--module", "trainscale.workloads", spec.workload]
        elif spec.module:
            head = ["--module", spec.module]
        else:
            head = ["--script", str(Path(spec.script or "").absolute())]
    line = " ".join(_q(a) for a in head + list(spec.args))
    if spec.workload and spec.requeue and not any(a.startswith("--checkpoint-dir") for a in spec.args):
        # the job directory is keyed by the job id, which a requeue keeps: the next attempt resumes here
        line += ' --checkpoint-dir "$JOB_DIR/checkpoints"'
    return [line] if line else []


def bind_env(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan) -> dict[str, str]:
    """TRAINSCALE_CPU_BIND for workers that bind themselves (torchrun mode) or check their binding (srun mode)."""
    if spec.cpu_bind or (profile.gpus_per_node and plan.ranks_per_node > profile.gpus_per_node):
        return {}
    return worker_bind_env(profile, plan.ranks_per_node)


def cpu_bind_option(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan) -> str:
    if spec.cpu_bind:
        return f"--cpu-bind={_q(spec.cpu_bind)}"
    if profile.gpus_per_node and plan.ranks_per_node > profile.gpus_per_node:
        return ""
    return slurm_cpu_bind(profile, plan.ranks_per_node)


def srun_command(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan) -> str:
    py = _q(python_of(spec))
    srun = ["srun --kill-on-bad-exit=1"]
    container = container_prefix(spec, profile)
    if plan.launcher == "torchrun":
        srun.append('--ntasks-per-node=1')
        if plan.cpus_per_task:
            srun.append('--cpus-per-task="$SLURM_CPUS_PER_TASK"')
        # The agent's task spans the node's CPUs and each worker binds itself from TRAINSCALE_CPU_BIND:
        # SLURM must not pin the task to a socket first (it also cannot lay out one task wider than a socket).
        srun.append("--cpu-bind=none")
        srun.append('--output="$JOB_DIR/node-%n.out"')
        if spec.requeue:
            srun.append("--open-mode=append")
        run = [f"{py} -m trainscale run", '--nnodes "$SLURM_NNODES"', f"--nproc-per-node {plan.ranks_per_node}",
               '--rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$SLURM_JOB_ID"',
               '--log-dir "$JOB_DIR/torchrun" --all-ranks']
        return _cont(srun + container + run + target_args(spec, "torchrun"))
    srun.append('--ntasks-per-node="$SLURM_NTASKS_PER_NODE"')
    if plan.cpus_per_task:
        srun.append('--cpus-per-task="$SLURM_CPUS_PER_TASK"')
    bind = cpu_bind_option(spec, profile, plan)
    if bind:
        srun.append(bind)
    srun.append('--output="$JOB_DIR/rank-%t.out"')
    if spec.requeue:
        srun.append("--open-mode=append")
    run = [f"{py} -m trainscale.launch.bootstrap"]
    return _cont(srun + container + run + target_args(spec, "srun"))


def header(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan) -> list[str]:
    command = shlex.join(spec.command_line) if spec.command_line else "(rendered from Python: trainscale.launch.slurm)"
    if plan.launcher == "torchrun":
        mode = (f"torchrun mode: one task per node runs `trainscale run` (torch's elastic agent), which starts "
                f"{plan.ranks_per_node} rank(s) on its node")
    else:
        mode = f"srun mode: one task per rank ({plan.ranks_per_node} per node), ranks read from SLURM's variables"
    return [
        "#!/bin/bash",
        f"# Generated by trainscale {__version__}. Change the command and render again rather than editing by hand.",
        f"# Command: {command}",
        f"# Profile: {profile.name}" + (f" ({profile.description})" if profile.description else ""),
        f"# {mode}.",
        f"# World size {plan.world_size} = {spec.nodes} node(s) x {plan.ranks_per_node} rank(s); "
        f"{plan.cpus_per_rank} CPU(s) per rank.",
    ]


def render(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan | None = None) -> str:
    """The complete batch script for ``spec`` on ``profile``."""
    plan = plan or resolve(spec, profile)
    py = _q(python_of(spec))
    out = header(spec, profile, plan) + sbatch_lines(spec, profile, plan) + ["", "set -euo pipefail"]
    if profile.modules:
        out += ["", "# Modules (profile)"] + list(profile.modules)
    exports = [(k, v, "profile") for k, v in profile.env.items()] + [(k, v, "command") for k, v in spec.env.items()]
    if exports:
        out += ["", "# Environment"] + [f"export {k}={_dq(v)}  # {src}" for k, v, src in exports]
    job_dir = job_dir_pattern(spec, plan).replace("%j", "${SLURM_JOB_ID}")
    out += [
        "",
        "# One directory per job: per-rank logs, error files and a copy of this script.",
        f"JOB_DIR={_q(job_dir) if ' ' in job_dir else job_dir}",
        'mkdir -p "$JOB_DIR/errors"' if plan.launcher == "srun" else 'mkdir -p "$JOB_DIR"',
        'cp -n -- "$0" "$JOB_DIR/job.sbatch" 2>/dev/null || true',
        f'export {JOB_DIR_VAR}="$JOB_DIR"',
    ]
    if plan.launcher == "srun":  # torchrun's agent gives each worker its own error file
        out.append(f'export {ERROR_DIR_VAR}="$JOB_DIR/errors"  # each rank\'s traceback, written by @record')
    out += [
        "export PYTHONUNBUFFERED=1",
        f"export OMP_NUM_THREADS={plan.cpus_per_rank}  # = CPUs per rank",
    ]
    if plan.launcher == "srun" and not spec.workload:
        out.append(f"export {EXPORT_TORCHRUN_VAR}=1  # RANK, LOCAL_RANK, WORLD_SIZE... per task for torchrun-style scripts")
    for key, value in bind_env(spec, profile, plan).items():
        why = "each worker binds itself" if plan.launcher == "torchrun" else "each task checks/applies its binding"
        out.append(f"export {key}={_q(value)}  # {why} (profile binding = {profile.binding})")
    port_cmd = f'{py} -m trainscale.launch.slurm.port --host "$MASTER_ADDR"'
    if spec.master_port:
        port_cmd += f" --port {spec.master_port}"
    if spec.container:
        port_cmd = container_prefix(spec, profile)[0] + " " + port_cmd
    out += [
        "",
        "# Rendezvous: the first node of the allocation; a port checked free there (this step runs on it).",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        f"MASTER_PORT=$({port_cmd})",
        "export MASTER_ADDR MASTER_PORT",
        'echo "trainscale: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, master $MASTER_ADDR:$MASTER_PORT, '
        'restart ${SLURM_RESTART_COUNT:-0}, logs in $JOB_DIR"',
        "",
    ]
    out += preemptible(srun_command(spec, profile, plan)) if spec.requeue else [srun_command(spec, profile, plan)]
    out.append("")
    return "\n".join(out)


DEFAULT_WARNING = "USR1@120"
"""With --requeue and no --signal: SIGUSR1 two minutes before the time limit or a preemption."""


def warning_signal(spec: SlurmJobSpec) -> str | None:
    return spec.signal or (DEFAULT_WARNING if spec.requeue else None)


def preemptible(srun_line: str) -> list[str]:
    """Run the step in the background so this shell can pass a signal on, and requeue for the ranks
    when they could not (no scontrol inside their container)."""
    return [
        "# Preemption: SLURM's warning signal reaches the tasks (--signal); one sent to this batch shell",
        "# (scancel --signal=USR1 --batch) is passed on through srun. The ranks checkpoint at the next step",
        "# boundary and rank 0 requeues the job; where it cannot reach scontrol it leaves a marker for us.",
        'trap \'echo "trainscale: batch shell got SIGUSR1, passing it to the ranks"; kill -USR1 "$SRUN_PID" 2>/dev/null\' USR1',
        srun_line + " &",
        "SRUN_PID=$!",
        "while true; do  # `wait` returns early when the trap runs: wait again until srun has ended",
        '  wait "$SRUN_PID" && status=0 || status=$?',
        '  kill -0 "$SRUN_PID" 2>/dev/null || break',
        "done",
        'if [ -f "$JOB_DIR/requeue-requested" ]; then',
        '  echo "trainscale: requeueing $(cat "$JOB_DIR/requeue-requested") from the batch step"',
        '  scontrol requeue "$(cat "$JOB_DIR/requeue-requested")" && rm -f "$JOB_DIR/requeue-requested"',
        "fi",
        'exit "$status"',
    ]
