"""Render a batch script from a spec and a profile. Pure: same inputs, same text (golden-file tested).

Every number comes from the :class:`~trainscale.launch.slurm.spec.JobPlan`; inside the script, srun
reads the allocation back from ``$SLURM_*`` variables instead of repeating numbers. The container
wrapper, the module lines and the launch line live in launch/slurm/container.py and here.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from trainscale._version import __version__
from trainscale.launch.bootstrap import ERROR_DIR_VAR, RUN_DIR_VAR, SNAPSHOT_OF_VAR, SNAPSHOT_VAR, TASK_GPU_VAR
from trainscale.launch.slurm import healing
from trainscale.launch.slurm.container import container_prefix, port_command, required_modules
from trainscale.launch.slurm.continuation import continues, end_lines, preemptible, start_lines, warning_signal
from trainscale.launch.slurm.continuation import exports as continuation_exports
from trainscale.launch.slurm.jobargs import check_lines, job_words
from trainscale.launch.slurm.layout import target_in_run
from trainscale.launch.slurm.spec import JobPlan, SlurmJobSpec, format_time, resolve
from trainscale.launch.slurm.toolchain import job_python, profile_module_lines
from trainscale.launch.slurm.toolchain import module_lines as job_module_lines
from trainscale.profiles import slurm_cpu_bind, worker_bind_env
from trainscale.profiles.schema import ClusterProfile
from trainscale.topology.cpulist import format_cpulist
from trainscale.topology.worker import PLAN_ENV

JOB_DIR_VAR = "TRAINSCALE_JOB_DIR"


def batch_output_pattern(spec: SlurmJobSpec, plan: JobPlan) -> str:
    # The batch step's own output lives beside the job directory, not in it: slurmd opens this
    # file before the script runs, so its directory must already exist (trainscale creates the
    # run directory at submission; the job directory only exists once the script has made it).
    return spec.output or str(plan.run_dir / "%j.out")


def _q(value: str | Path) -> str:
    return shlex.quote(str(value))


def _dq(value: str) -> str:
    """Double-quote a value for ``export``: ``${VAR}`` still expands (profiles rely on it), nothing else does."""
    if re.fullmatch(r"[A-Za-z0-9_@%+=:,./-]+", value):
        return value
    return '"' + re.sub(r'([\\"`])', r"\\\1", value).replace("$(", "\\$(") + '"'


def sbatch_lines(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan) -> list[str]:
    opts = [f"--job-name={spec.name}", f"--nodes={healing.allocated(spec)}", f"--ntasks-per-node={plan.tasks_per_node}"]
    if spec.heals:
        opts.append("--no-kill")  # a node failure leaves the job its other nodes (healing.py)
    if plan.cpus_per_task:
        opts.append(f"--cpus-per-task={plan.cpus_per_task}")
    if plan.gpus_per_node:
        opts.append(f"--gpus-per-node={spec.gpu_type + ':' if spec.gpu_type else ''}{plan.gpus_per_node}")
    if spec.cpus_per_gpu:
        opts.append(f"--cpus-per-gpu={spec.cpus_per_gpu}")
    if plan.mem_per_gpu:
        opts.append(f"--mem-per-gpu={plan.mem_per_gpu}")
    if plan.mem_per_node:
        opts.append(f"--mem={plan.mem_per_node}")
    opts.append(f"--time={format_time(plan.time_s)}")
    for flag, value in (
        ("partition", plan.partition),
        ("account", spec.account),
        ("reservation", spec.reservation),
        ("qos", spec.qos),
        ("constraint", spec.constraint),
        ("gpu-bind", spec.gpu_bind),
        ("dependency", spec.dependency),
        ("array", spec.array),
        ("mail-type", spec.mail_type),
        ("mail-user", spec.mail_user),
        ("export", spec.export),
        ("chdir", spec.chdir),
    ):
        if value:
            opts.append(f"--{flag}={value}")
    if spec.exclusive:
        opts.append("--exclusive")
    signal = warning_signal(spec, plan.facts.imports_trainscale)
    if signal:
        opts.append(f"--signal={signal}")
    # otherwise the site's JobRequeue decides; a self-healing job is requeued when its batch host's node fails
    requeue = spec.requeue if spec.requeue is not None or not spec.heals else True
    if requeue is not None:
        opts.append("--requeue" if requeue else "--no-requeue")
    if requeue:  # a requeued job writes the same batch output: every attempt's lines kept, not the last one's
        opts.append("--open-mode=append")
    opts.append(f"--output={batch_output_pattern(spec, plan)}")
    if spec.error:
        opts.append(f"--error={spec.error}")
    opts.extend(line.strip() for line in spec.extra_sbatch)
    return [f"#SBATCH {o}" for o in opts]


# How each launcher takes a workload, a module and a script: `trainscale run`'s options, and the
# bootstrap's (the workloads' dispatcher takes the name as its first argument).
_TARGET_OPTIONS = {
    "torchrun": {"workload": ["--workload"], "module": ["-m"], "script": []},
    "srun": {"workload": ["--module", "trainscale.workloads"], "module": ["--module"], "script": ["--script"]},
}


def target_args(spec: SlurmJobSpec, launcher: str, plan: JobPlan) -> str:
    """What to run, in the form the launcher takes: the script's copy in the run's snapshot, then its
    arguments with job-time variables expanded (jobargs.py)."""
    kind, target = (
        ("workload", spec.workload)
        if spec.workload
        else ("module", spec.module)
        if spec.module
        else ("script", target_in_run(spec.script, spec.snapshot, plan.code_root, plan.run_dir).script)
    )
    head = [*_TARGET_OPTIONS[launcher][kind], str(target)]
    line = " ".join([_q(a) for a in head] + job_words(spec.args)[0])
    if (
        spec.workload
        and (continues(spec) or spec.heals)
        and not spec.sweep
        and not any(a.startswith("--checkpoint-dir") for a in spec.args)
    ):
        # the run directory outlives requeues and chain links: every attempt resumes from here
        line += ' --checkpoint-dir "$RUN_DIR/checkpoints"'
    if (
        spec.workload
        and spec.sweep
        and continues(spec)
        and not any(a.startswith("--checkpoint-dir") for a in spec.args)
    ):
        line += ' --checkpoint-dir "$TASK_DIR/checkpoints"'  # a requeued task resumes its own run, no other's
    if spec.sweep:
        line += ' "${TASK_ARGS[@]}"'  # this array task's configuration (and its own directory)
    return line


def bind_env(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan) -> dict[str, str]:
    """TRAINSCALE_CPU_BIND for workers that bind themselves (torchrun mode) or check their binding (srun mode)."""
    if spec.cpu_bind or (profile.gpus_per_node and plan.ranks_per_node > profile.gpus_per_node):
        return {}
    if plan.partial_node and profile.binding == "map":
        # SLURM chooses which GPUs a partial node gets: bind on the node, to the GPUs the task really has.
        reserved = format_cpulist(profile.reserved_cores)
        return {PLAN_ENV: f"topology:{reserved}" if reserved else "topology"}
    return worker_bind_env(profile, plan.ranks_per_node)


def cpu_bind_option(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan) -> str:
    if spec.cpu_bind:
        return f"--cpu-bind={_q(spec.cpu_bind)}"
    if profile.gpus_per_node and plan.ranks_per_node > profile.gpus_per_node:
        return ""
    if plan.partial_node and profile.binding == "map":
        return "--cpu-bind=none"  # the fixed masks name GCDs this job may not have; the tasks bind themselves
    return slurm_cpu_bind(profile, plan.ranks_per_node)


def launch_command(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan) -> list[str]:
    """The command each srun task runs, after the container prefix."""
    python = job_python(spec, profile)
    py, kit = _q(python.command), python.kit  # kit: a Python without trainscale (a stock image, a module's)
    if plan.launcher == "torchrun":
        rdzv = [
            '--nnodes "$RUN_NODES"' if spec.heals else '--nnodes "$SLURM_NNODES"',
            f"--nproc-per-node {plan.ranks_per_node}",
            '--rdzv-backend c10d --rdzv-endpoint "$MASTER_ADDR:$MASTER_PORT" --rdzv-id "$SLURM_JOB_ID"',
        ]
        if kit:  # the Python's own torchrun, each worker started through the kit's bootstrap
            return (
                [f"{py} -m torch.distributed.run"]
                + rdzv
                + ['--log-dir "$JOB_DIR/torchrun" --tee 3']
                + [f'"$KIT/boot.py" {target_args(spec, "srun", plan)}']
            )
        return (
            [f"{py} -m trainscale run"]
            + rdzv
            + ['--log-dir "$JOB_DIR/torchrun" --all-ranks', target_args(spec, "torchrun", plan)]
        )
    run = f'{py} "$KIT/boot.py"' if kit else f"{py} -m trainscale.launch.bootstrap"
    return [run, target_args(spec, "srun", plan)]


def srun_command(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan) -> str:
    srun = ["srun --kill-on-bad-exit=1"]
    wrapper = container_prefix(spec, profile, plan)
    if plan.launcher == "torchrun":
        srun.append("--ntasks-per-node=1")
        if plan.cpus_per_task:
            srun.append('--cpus-per-task="$SLURM_CPUS_PER_TASK"')
        # The agent's task spans the node's CPUs and each worker binds itself from TRAINSCALE_CPU_BIND:
        # SLURM must not pin the task to a socket first (it also cannot lay out one task wider than a socket).
        srun.append("--cpu-bind=none")
        srun.append('--output="$JOB_DIR/node-%n.out"')
    else:
        srun.append('--ntasks-per-node="$SLURM_NTASKS_PER_NODE"')
        if plan.cpus_per_task:
            srun.append('--cpus-per-task="$SLURM_CPUS_PER_TASK"')
        if plan.task_gpu == "slurm":
            srun.append("--gpus-per-task=1")  # SLURM's cgroups give each task its own GPU (profile task_gpu)
        bind = cpu_bind_option(spec, profile, plan)
        if bind:
            srun.append(bind)
        srun.append('--output="$JOB_DIR/rank-%t.out"')
    if continues(spec) or spec.heals:
        srun.append("--open-mode=append")
    if spec.heals:
        srun += healing.srun_options(1 if plan.launcher == "torchrun" else plan.tasks_per_node)
    srun += wrapper.srun_options
    return " \\\n    ".join(srun + wrapper.words + launch_command(spec, profile, plan))  # one piece per line


def header(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan) -> list[str]:
    command = shlex.join(spec.command_line) if spec.command_line else "(rendered from Python: trainscale.launch.slurm)"
    python = job_python(spec, profile)
    if plan.launcher == "torchrun":
        agent = (
            "the image's torchrun"
            if spec.container
            else (f"{python.command}'s own torchrun" if python.kit else "`trainscale run` (torch's elastic agent)")
        )
        mode = f"torchrun mode: one task per node runs {agent}, which starts {plan.ranks_per_node} rank(s) on its node"
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
        f"# Python: {python.describe(spec)}"
        + (
            "; it needs torch, and trainscale's worker side comes from the job kit"
            + (
                " (the script imports trainscale: that Python must have it too)"
                if plan.facts.imports_trainscale
                else ""
            )
            if python.kit
            else ""
        )
        + ".",
    ]


def module_lines(spec: SlurmJobSpec, profile: ClusterProfile) -> list[str]:
    lines = list(job_module_lines(spec, profile))
    if not lines:
        return []
    ours = profile_module_lines(spec, profile)
    which = (
        "[container] modules"
        if ours and spec.container and profile.container and profile.container.modules is not None
        else "modules"
    )
    if not spec.profile_modules:
        source = f"--module; profile {profile.name}'s left out by --no-profile-modules"
    else:
        source = (
            f"profile {profile.name}'s {which}" + (", then --module" if spec.modules else "") if ours else "--module"
        )
    hint = (
        "hint: remove the module lines (--module, the profile's modules) on a cluster without modules, or "
        "load them in --setup after sourcing your site's module init script"
    )
    return [
        "",
        f"# Modules ({source}). Lmod reads unset variables: `set -u` is off around them.",
        "if ! type module >/dev/null 2>&1; then",
        "  for init in /usr/share/lmod/lmod/init/bash /etc/profile.d/lmod.sh /etc/profile.d/modules.sh; do",
        '    if [ -r "$init" ]; then set +u; . "$init"; set -u; break; fi',
        "  done",
        "fi",
        "if ! type module >/dev/null 2>&1; then",
        '  echo "trainscale: error: this job loads modules, but there is no \\`module\\` command on $(hostname)" >&2',
        f'  echo "{hint}" >&2',
        "  exit 1",
        "fi",
        "set +u",
        *lines,
        "set -u",
    ]


def setup_lines(spec: SlurmJobSpec, profile: ClusterProfile) -> list[str]:
    lines = list(profile.setup) + list(spec.setup)
    if not lines:
        return []
    where = "profile, then --setup" if profile.setup and spec.setup else ("profile" if profile.setup else "--setup")
    return ["", f"# Setup ({where}), before launch; `set -u` off as for modules.", "set +u", *lines, "set -u"]


def render(
    spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan | None = None, *, kit_dir: Path | None = None
) -> str:
    """The complete batch script for ``spec`` on ``profile``. A container job's script names the job kit
    at ``kit_dir`` (default: where :func:`trainscale.launch.kit.kit_dir` puts it beside the jobs)."""
    plan = plan or resolve(spec, profile)
    out = header(spec, profile, plan) + sbatch_lines(spec, profile, plan) + ["", "set -euo pipefail"]
    out += module_lines(spec, profile)
    exports = [(k, v, "profile") for k, v in profile.env.items()] + [(k, v, "command") for k, v in spec.env.items()]
    if exports:
        out += ["", "# Environment"] + [f"export {k}={_dq(v)}  # {src}" for k, v, src in exports]
    out += setup_lines(spec, profile)
    handles = plan.facts.imports_trainscale
    out += [
        "",
        "# The run directory (made at submission: this script, submission.json, src/ - the copy of your code",
        "# this job runs - and checkpoints) and one directory per job in it: per-rank logs, error files.",
        f"RUN_DIR={_q(plan.run_dir)}",
        'JOB_DIR="$RUN_DIR/${SLURM_JOB_ID}"',
        f'export {RUN_DIR_VAR}="$RUN_DIR" {JOB_DIR_VAR}="$JOB_DIR"',
    ]
    if spec.sweep:
        out += [
            "# A sweep: this array task's configuration, and its own directory (checkpoints, metrics.json).",
            'TASK_DIR="$RUN_DIR/task-${SLURM_ARRAY_TASK_ID}"',
            'mkdir -p "$TASK_DIR" && rm -f "$TASK_DIR/failed"',
            'mapfile -t TASK_ARGS < "$RUN_DIR/tasks/${SLURM_ARRAY_TASK_ID}.args"',
            f'export {RUN_DIR_VAR}="$TASK_DIR"  # metrics.json here is gathered by trainscale sweep status',
            'echo "trainscale: sweep task ${SLURM_ARRAY_TASK_ID}: ${TASK_ARGS[*]}"',
        ]
    out += start_lines(spec)
    out.append('mkdir -p "$JOB_DIR/errors"' if plan.launcher == "srun" else 'mkdir -p "$JOB_DIR"')
    if continues(spec):
        out.append('rm -f "$JOB_DIR/stopped"  # a requeued job starts over in the same directory')
    target = target_in_run(spec.script, spec.snapshot, plan.code_root, plan.run_dir)
    if target.snapshot:
        out.append(
            f"export {SNAPSHOT_VAR}={_q(target.snapshot)} {SNAPSHOT_OF_VAR}={_q(plan.code_root)}"
            "  # the code as submitted: imports from the original map to this copy"
        )
    if target.pythonpath:
        out.append(f"export PYTHONPATH={_q(target.pythonpath)}${{PYTHONPATH:+:$PYTHONPATH}}  # the copy of --snapshot")
    python = job_python(spec, profile)
    if python.kit:
        from trainscale.launch.kit import kit_dir as default_kit_dir  # noqa: PLC0415 (CLI start-up)

        kit = kit_dir or default_kit_dir(plan.output_dir)
        out += [
            f"KIT={_q(kit)}  # the job kit: trainscale's bootstrap and port check (standard library only)",
            '[ -f "$KIT/boot.py" ] || { echo "trainscale: error: the job kit $KIT is missing; it is written when '
            'trainscale submits the job (hint: submit with trainscale slurm --submit, or copy the kit back)" '
            ">&2; exit 1; }",
        ]
    if plan.launcher == "srun":  # torchrun's agent gives each worker its own error file
        out.append(f'export {ERROR_DIR_VAR}="$JOB_DIR/errors"  # each rank\'s traceback, written by @record')
    out += [
        "export PYTHONUNBUFFERED=1",
        *threads_lines(plan.cpus_per_rank, plan.ranks_per_node),
    ]
    if plan.task_gpu and plan.task_gpu != "slurm":
        out.append(
            f"export {TASK_GPU_VAR}={plan.task_gpu}  # each task sees only its own GPU "
            f"(profile task_gpu = {profile.task_gpu})"
        )
    for key, value in bind_env(spec, profile, plan).items():
        why = "each worker binds itself" if plan.launcher == "torchrun" else "each task checks/applies its binding"
        note = (
            "on the node: a partial node's GPUs are SLURM's choice"
            if plan.partial_node and profile.binding == "map"
            else f"profile binding = {profile.binding}"
        )
        out.append(f"export {key}={_q(value)}  # {why} ({note})")
    if profile.interconnect and profile.gpus_per_node:
        out.append(
            f"export TRAINSCALE_INTERCONNECT={profile.interconnect}"
            + (" TRAINSCALE_INTERCONNECT_REQUIRED=1" if profile.interconnect_required else "")
            + "  # the network the ranks' collectives must use between nodes (profile)"
        )
    out += continuation_exports(spec, handles)
    if python.kit and plan.launcher == "torchrun":
        out.append(
            "export TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE='[rank${rank}]: '  # trainscale jobs JOB --rank reads it"
        )
        if warning_signal(spec, handles):
            out.append(
                "export PET_SIGNALS_TO_HANDLE=SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1,SIGUSR2  "
                "# torchrun passes SLURM's warning on to the workers"
            )
    port = port_command(spec, profile, plan, python, required_modules(spec, plan, python.kit))
    out += [
        "",
        "# Rendezvous: the first node of the allocation; a port checked free there (this step runs on it).",
        'MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)',
        *port,
        "export MASTER_ADDR MASTER_PORT",
        'echo "trainscale: job $SLURM_JOB_ID on $SLURM_JOB_NODELIST, master $MASTER_ADDR:$MASTER_PORT, '
        'restart ${SLURM_RESTART_COUNT:-0}, logs in $JOB_DIR"',
        "",
    ]
    out += check_lines(job_words(spec.args)[1])
    srun = srun_command(spec, profile, plan)
    if spec.heals:
        step = (
            preemptible(srun, spec, handles, ending=False) if continues(spec) else [srun + " && status=0 || status=$?"]
        )
        out += healing.lines(
            spec, step, end_lines(spec) if continues(spec) else ['exit "$status"'], again=[*port, "export MASTER_PORT"]
        )
    elif continues(spec):
        out += preemptible(srun, spec, handles)
    elif spec.sweep:
        out += [
            srun + " && status=0 || status=$?",
            'if [ "$status" -eq 0 ]; then date > "$TASK_DIR/finished"; '
            'else echo "exit code $status" > "$TASK_DIR/failed"; fi',
            'exit "$status"',
        ]
    else:
        out.append(srun)
    out.append("")
    return "\n".join(out)


def threads_lines(cpus_per_rank: int, ranks_per_node: int) -> list[str]:
    """OMP_NUM_THREADS = CPUs per rank, but never more than the node really lets the job use per rank
    (``nproc``: the batch step's CPUs): a profile or a node definition that overstates the cores would
    otherwise have OpenMP threads outnumber them and spin-wait for each other."""
    return [
        f"OMP_NUM_THREADS=$(( $(nproc) / {ranks_per_node} ))",
        f"export OMP_NUM_THREADS=$(( OMP_NUM_THREADS < 1 ? 1 : OMP_NUM_THREADS > {cpus_per_rank} ? {cpus_per_rank} "
        f": OMP_NUM_THREADS ))  # = CPUs per rank ({cpus_per_rank}), fewer where the node has fewer",
    ]
