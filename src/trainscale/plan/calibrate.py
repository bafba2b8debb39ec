"""``trainscale plan``'s acting part: the calibration run (one rank, a few steps, a trial of launch/trial.py, its
records read back), the room per rank and the network the plan is made for. The modelling is
plan/model.py's (pure); the CLI only parses and prints.
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from trainscale.bench import allreduce_run
from trainscale.bench.study import read_metrics
from trainscale.bench.validity import disturbance
from trainscale.errors import ConfigError
from trainscale.launch.preflight import option_value
from trainscale.launch.slurm.spec import parse_mem_gb, usable_cpus
from trainscale.launch.trial import WORKLOADS, here
from trainscale.observe.reading import other_work, steady, step_records, steps_peaks
from trainscale.observe.records import read_lines
from trainscale.plan.comm import Network, Sweep, get_network
from trainscale.plan.model import STRATEGIES, Calibration, Plan, ladder, make_plan
from trainscale.profiles import load_profile
from trainscale.topology.apply import current_affinity
from trainscale.workloads.registry import get_workload

PROFILE_NETWORKS = {"ofi": "slingshot-11", "ib": "ib-hdr200", "socket": "ethernet-25g"}
"""A profile's ``interconnect`` as the plan's network (plan/comm.NETWORKS)."""
DEFAULT_NETWORK = "ethernet-25g"


def short_run(
    *,
    script: str | None,
    args: tuple[str, ...],
    workload: str | None,
    batch: int | None,
    steps: int,
    say: Callable[[str], None],
    nproc: int = 1,
    strategy: str | None = None,
    threads: int | None = None,
    timeout_s: float = 900.0,
    alone: bool = False,
) -> tuple[list[dict], dict | None, list[int], float | None]:
    """Run the script (or workload) on ``nproc`` ranks here for ``steps`` optimizer steps and more (a trial,
    launch/trial.py): rank 0's records, a workload's metrics (its memory table), every rank's peak memory over its
    training steps and the share of its CPUs other work kept busy (observe/reading.other_work; None: not sampled). A
    script runs in the working directory (its relative paths) and is stopped after ``steps`` by its recorder
    (observe/state.py); its rt.checkpoint files go to a directory of the run's own (it neither resumes from nor
    writes into the user's). A workload runs ``steps + 1`` steps to its normal end in a temporary directory.
    ``threads``: the rank's OMP_NUM_THREADS (a user's own setting is kept). ``alone``: a script's ``rt.setup`` wraps
    its model on one rank as on several (observe/state.PLAN_ALONE_VAR)."""
    from trainscale.observe.state import PLAN_ALONE_VAR, PLAN_STEPS_VAR  # noqa: PLC0415 (torch-free module)
    from trainscale.train.resumable import CHECKPOINT_DIR_VAR  # noqa: PLC0415 (torch-free module)

    with tempfile.TemporaryDirectory(prefix="trainscale-plan-") as tmp:
        run_dir, metrics = Path(tmp) / "run", Path(tmp) / "metrics.json"
        env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("TRAINSCALE_TRAIN_")}
        env.update(
            {
                CHECKPOINT_DIR_VAR: str(Path(tmp) / "checkpoints"),
                "TRAINSCALE_RECORD": "1",
                "TRAINSCALE_HANG_NOTICE": "0",
            }
        )
        if threads and "OMP_NUM_THREADS" not in os.environ:
            env["OMP_NUM_THREADS"] = str(threads)
        if workload:
            line = [
                "--workload",
                workload,
                *args,
                *get_workload(workload).batch_args(batch, nproc),
                *(["--strategy", strategy] if strategy else []),
                "--epochs",
                "1000",
                "--log-every",
                "0",
            ]
            if nproc == 1:  # the calibration: the state counted, then stopped by the recorder
                env[PLAN_STEPS_VAR] = str(steps)
            else:
                line += ["--max-steps", str(steps + 1), "--metrics-out", str(metrics)]
            target, module, targs, cwd = WORKLOADS, True, (workload, *line[2:]), Path(tmp)
        else:
            env[PLAN_STEPS_VAR] = str(steps)
            if alone:
                env[PLAN_ALONE_VAR] = "1"
            line = [str(Path(script).absolute()), *args]
            target, module, targs, cwd = line[0], False, tuple(args), None
        calibrating = nproc == 1
        shown = shlex.join(["run", "--nproc-per-node", str(nproc), *line])
        say(f"{'calibrating' if calibrating else 'verifying'}: {shown} ({nproc} rank(s), {steps + 1} optimizer steps)")
        done = here(target, targs, module=module, nproc=nproc, run_dir=run_dir, env=env, cwd=cwd, timeout_s=timeout_s)
        if done.timed_out:
            said = "the calibration run took more than" if calibrating else "the verification run took more than"
            raise ConfigError(
                f"{said} {timeout_s:.0f} s for {steps + 1} steps", hint="give fewer --steps, or a smaller batch"
            )
        found = run_dir / "metrics" / "rank-0.jsonl"
        if done.ok and not found.exists():  # it ended by itself before a step: nothing to plan from
            raise ConfigError(
                "the calibration run recorded no optimizer step with parameters: the script ended without training",
                hint="plan needs a script that trains (a torch optimizer's step)",
            )
        if not done.ok or not found.exists():
            said = [
                line
                for line in done.summary.strip().splitlines()  # not the logs of a directory about to go
                if tmp not in line and not line.startswith("=====")
            ]
            tail = "\n".join(said[-15:])
            said = "the calibration run failed" if calibrating else "the verification run failed"
            raise ConfigError(f"{said}:\n{tail}", hint="run the same line with trainscale run to see why")
        return (
            list(read_lines(found)),
            json.loads(metrics.read_text()) if metrics.exists() else None,
            steps_peaks(run_dir),
            other_work(run_dir),
        )


def calibrate(
    *,
    script: str | None,
    args: tuple[str, ...],
    workload: str | None,
    batch: int | None,
    steps: int,
    say: Callable[[str], None],
    threads: int | None = None,
    timeout_s: float = 900.0,
    strategy: str | None = None,
    alone: bool = False,
) -> Calibration:
    """One rank, ``steps`` optimizer steps: what its state holds and how long its steps take (on CPU with
    ``threads`` threads: those a rank of the planned node gets); a workload under ``strategy``; ``alone``: a
    script's ``rt.setup`` strategy wrapping its model as on several ranks."""
    records, _, _, _ = short_run(
        script=script,
        args=args,
        workload=workload,
        batch=batch,
        steps=steps,
        say=say,
        threads=threads,
        timeout_s=timeout_s,
        strategy=strategy,
        alone=alone,
    )
    return Calibration.from_records(records)


OWN_CALIBRATIONS = {"fsdp": "fsdp:shard_alone=true"}
"""What a workload's plan also calibrates, one rank each: FSDP over a group of one does its per-unit work (its
flat copies, its hooks, the optimizer over sharded tensors) that the plain calibration never does."""
SWEEP_SIZES = "4B,16KB,256KB,1MB,4MB,16MB"


def sweep_hooks(workload_args: tuple[str, ...] | None, strategy: str | None) -> tuple[str, ...]:
    """What a plan for ``strategy`` (None: every strategy) measures among CPU ranks here: the backend's
    all-reduce (none) for the sharded strategies' collectives and a script's own DDP (``workload_args`` None),
    and for a workload's ddp and zero1 gradients what they average with (:func:`averaging_hook`:
    trainscale's shared-memory average unless ``comm_hook`` names another)."""
    from trainscale.strategies import state_sharding  # noqa: PLC0415 (torch-free module)

    if workload_args is None:
        return ("none",)
    ddp = "shm" if averaging_hook(workload_args) in ("auto", "shm") else "none"
    if strategy is None:
        return tuple(dict.fromkeys(("none", ddp)))
    shard = state_sharding(strategy)  # DDP's buckets average with ddp's hook; what a strategy shards, with gloo
    wanted = (("none",) if shard.params or shard.grads or shard.optimizer else ()) + ((ddp,) if shard.buckets else ())
    return tuple(dict.fromkeys(wanted)) or ("none",)


def setup_args(cal: Calibration) -> tuple[str, ...] | None:
    """A script's ``rt.setup`` as a workload's ``--strategy``: trainscale's ddp and zero1 average as its
    ``comm_hook`` says (``auto``, the default, in shared memory on one node's CPUs; a strategy without the option,
    fsdp, leaves ddp's rows at that default), or None for a script that wraps its own model (gloo's all-reduce)."""
    return ("--strategy", f"{cal.setup}:comm_hook={cal.setup_hook or 'auto'}") if cal.setup else None


def averaging_hook(workload_args: tuple[str, ...] | list[str]) -> str:
    """What a workload's DDP averages with, for the all-reduce benchmark's ``--hook``: ``shm`` or ``auto`` as
    named in ``--strategy ...:comm_hook=`` (default auto), the backend's (none) otherwise."""
    from trainscale.strategies import parse_spec  # noqa: PLC0415 (torch-free module)

    hook = parse_spec(option_value(workload_args, "--strategy") or "ddp")[1].get("comm_hook", "auto").lower()
    return hook if hook in ("auto", "shm") else "none"


def sweeps_here(ranks_per_node: int, say: Callable[[str], None], hooks: tuple[str, ...]) -> list[Sweep]:
    """The all-reduce on this machine (bench/allreduce.py, launched like training) among each count of ranks
    the plan's rows and ``--verify`` run here (2, 4, ... up to ``ranks_per_node``), timed by each of ``hooks``
    (:func:`sweep_hooks`)."""
    out = []
    for ranks in sorted({n for n, _ in ladder(ranks_per_node, 1) if n > 1}):
        for hook in hooks:
            say(f"measuring: the all-reduce among {ranks} ranks here ({SWEEP_SIZES}, {Sweep.HOOKS[hook]})")
            with tempfile.TemporaryDirectory(prefix="trainscale-plan-") as tmp:
                result = allreduce_run.measure(
                    None,
                    nproc=ranks,
                    sizes=SWEEP_SIZES,
                    out_file=Path(tmp) / "allreduce.json",
                    logs=Path(tmp) / "runs",
                    iters=20,
                    budget_s=0.3,
                    device="cpu",
                    hook=hook,
                )
            if "error" in result:
                raise ConfigError(
                    f"the all-reduce among {ranks} ranks here failed: {result['error']}",
                    hint="trainscale doctor checks that ranks here can reach each other",
                )
            out.append(Sweep.from_result(result))
    return out


VERIFIED = ("ddp", "zero1", "fsdp")
"""The strategies ``--verify`` runs for a workload (DeepSpeed's first start compiles for a minute: left out)."""


def verify(
    plan: Plan,
    *,
    script: str | None,
    args: tuple[str, ...],
    workload: str | None,
    steps: int,
    say: Callable[[str], None],
) -> list[dict]:
    """``plan --verify``: the cheapest several-rank configuration the plan predicts (2 ranks here; 1 where the plan
    is for one), under each strategy trainscale runs for a workload (a script's own for a script), run here for
    a few steps: the predicted step time, model state and peak against the measured ones, a run that other work
    disturbed marked as a study marks it (bench/validity.disturbance)."""
    ranks = 2 if plan.world > 1 else 1
    out = []
    for strategy in VERIFIED if workload else (None,):
        records, metrics, peaks, share = short_run(
            script=script,
            args=args,
            workload=workload,
            batch=plan.batch,
            steps=steps,
            say=say,
            nproc=ranks,
            strategy=strategy,
        )
        out.append(
            compare(plan, records, metrics, peaks, ranks=ranks, nodes=1, strategy=strategy)
            | {"other_cpu_share": share, "disturbed": disturbance({"other_cpu_share": share}, None)}
        )
    return out


def compare(
    plan: Plan,
    records: list[dict],
    metrics: dict | None,
    peaks: list[int],
    *,
    ranks: int,
    nodes: int,
    strategy: str | None,
    batch: int | None = None,
) -> dict:
    """One measured configuration against the plan: the median step after the first, the model state (parameters,
    gradients and optimizer state) of the fullest rank (a workload's memory table; a script's rank 0 records) and
    the largest peak of any rank over its training steps (``peaks``), each with its error."""
    times = [float(r["step_s"]) for r in steady(step_records(records))]
    if metrics and metrics.get("memory"):  # the fullest rank, as the plan predicts it (what must fit)
        held = float(max(row["params"] + row["grads"] + row["optimizer"] for row in metrics["memory"]["ranks"]))
    else:
        state = next((r for r in records if r.get("kind") == "state"), None)
        held = float(state["params_bytes"] + state["grads_bytes"] + state["optimizer_bytes"]) if state else None
    peak = float(max(peaks)) if peaks else None
    modelled = strategy or plan.calibration.modelled_strategy()  # a script's own, as its run showed it
    m = plan.rank_memory(modelled, ranks, batch or plan.batch)
    predicted = plan.predict(ranks, nodes, modelled, batch=batch or plan.batch)
    step = statistics.median(times) if times else float("nan")

    def error(measured: float | None, want: float) -> float | None:
        return measured / want - 1 if measured is not None and want else None

    return {
        "config": f"{ranks} x {strategy or f'your script ({modelled})'}" + (f" on {nodes} nodes" if nodes > 1 else ""),
        "ranks": ranks,
        "nodes": nodes,
        "strategy": modelled,
        "steps": len(times) + 1,
        "predicted_step_s": predicted["step_s"],
        "band_s": predicted["band_s"],
        "uncertain": predicted["uncertain"],
        "measured_step_s": step,
        "step_error": error(step, predicted["step_s"]) if times else None,
        "predicted_held": m.held,
        "measured_held": held,
        "held_error": error(held, m.held),
        "predicted_peak": m.peak,
        "measured_peak": peak,
        "peak_error": error(peak, m.peak) if plan.calibration.peak else None,
    }


def room(profile, ranks_per_node: int, mem: str | None = None) -> tuple[float | None, str]:
    """Memory one rank may use: ``--mem`` (sbatch's: per node) over the ranks, else the profile's GPU (or its
    node's share per rank), else this machine's (its GPU, or its memory within this process's cgroup limit:
    SLURM's ``--mem`` on the node the plan runs on)."""
    if mem:
        return parse_mem_gb(mem) * 2**30 / ranks_per_node, f"--mem {mem} / {ranks_per_node} rank(s)"
    if profile is not None:
        if profile.gpus_per_node and profile.mem_per_gpu_gb:
            return profile.mem_per_gpu_gb * 2**30, f"profile {profile.name}: {profile.mem_per_gpu_gb:g} GB per GPU"
        if profile.mem_per_node_gb:
            return (
                profile.mem_per_node_gb * 2**30 / ranks_per_node,
                f"profile {profile.name}: {profile.mem_per_node_gb:g} GB per node / {ranks_per_node} rank(s)",
            )
        return None, f"profile {profile.name} gives no memory"
    import torch  # noqa: PLC0415 (torch-free module)

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return float(props.total_memory), f"this machine's GPU 0, {props.name}"
    try:
        import psutil  # noqa: PLC0415 (optional dependency)

        total, what = float(psutil.virtual_memory().total), "this machine's"
    except ImportError:
        return None, "psutil is not installed"
    limit = cgroup_limit()
    if limit is not None and limit < total:
        total, what = limit, "this process's cgroup limit,"
    return total / ranks_per_node, f"{what} {total / 2**30:.1f} GiB / {ranks_per_node} rank(s)"


def cgroup_limit(proc: Path = Path("/proc/self/cgroup"), root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """The memory limit of this process's cgroup (v2 ``memory.max``, v1 ``memory.limit_in_bytes``); None
    where there is none or it cannot be read."""
    try:
        lines = proc.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":  # v2's unified hierarchy
            candidate = root / path.lstrip("/") / "memory.max"
        elif "memory" in controllers.split(","):
            candidate = root / "memory" / path.lstrip("/") / "memory.limit_in_bytes"
        else:
            continue
        try:
            text = candidate.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 2**60:  # "max", or v1's page-rounded 2^63: no limit
            return float(text)
    return None


def network(name: str | None, profile) -> tuple[Network, str]:
    """The interconnect the time model charges: --interconnect, else the profile's, else an assumption said so."""
    if name:
        return get_network(name), f"--interconnect {name}"
    if profile is not None and PROFILE_NETWORKS.get(profile.interconnect):
        preset = PROFILE_NETWORKS[profile.interconnect]
        return get_network(preset), f"{preset} (profile {profile.name})"
    return get_network(DEFAULT_NETWORK), f"{DEFAULT_NETWORK} (assumed: give --interconnect NAME)"


def submit_line(
    *,
    profile,
    nodes: int,
    ranks_per_node: int,
    strategy: str | None,
    workload: str | None,
    script: str | None,
    args: tuple[str, ...],
    batch: int | None,
) -> str:
    """The command that runs the recommended configuration."""
    if workload:
        target = [
            "--workload",
            workload,
            *args,
            *(["--strategy", strategy] if strategy else []),
            *get_workload(workload).batch_args(batch, ranks_per_node * nodes),
        ]
    else:
        target = [script, *args]
    if profile is None and nodes == 1:
        return shlex.join(["trainscale", "run", "--nproc-per-node", str(ranks_per_node), *target])
    if profile is None:  # several nodes need a cluster: name its profile
        line = shlex.join(
            [
                "trainscale",
                "slurm",
                "--profile",
                "YOURS",
                "-N",
                str(nodes),
                "--gpus-per-node",
                str(ranks_per_node),
                "-t",
                "01:00:00",
                "--submit",
                *target,
            ]
        )
        return line + "   (--profile: your cluster's, trainscale profiles)"
    head = [
        "trainscale",
        "slurm",
        "--profile",
        profile.name,
        "-N",
        str(nodes),
        "--gpus-per-node",
        str(ranks_per_node),
        "-t",
        "01:00:00",
        *(["-A", "PROJECT"] if profile.requires_account else []),
        "--submit",
    ]
    line = shlex.join([*head, *target])
    return line + (
        "" if workload or not strategy else f"   (the strategy is your script's: rt.setup(..., strategy={strategy!r}))"
    )


def make(
    *,
    script: str | None,
    args: tuple[str, ...],
    workload: str | None,
    profile_name: str | None,
    ranks_per_node: int,
    nodes: int,
    batch: int | None,
    interconnect: str | None,
    steps: int,
    say: Callable[[str], None],
    check: bool = False,
    mem: str | None = None,
    timeout_s: float = 900.0,
    only: str | None = None,
) -> tuple[Plan, str | None]:
    """``trainscale plan``: the refusals, the calibration, the plan and the line that submits it (None when
    nothing fits: no line that would run out of memory); ``check`` (``--verify``): the cheapest configurations run
    here, predicted against measured. ``only``: the one strategy whose times must be right (a study's): what only
    the others need is not measured (their times then fall back to what was)."""
    if bool(workload) == bool(script):  # both, or neither
        raise ConfigError(
            "give one thing to plan: --workload NAME or SCRIPT [ARGS]",
            hint="trainscale plan --workload gpt --nproc-per-node 8, or trainscale plan train.py",
        )
    if script and not Path(script).is_file():
        raise ConfigError(f"script {script} not found", hint="give the path of your training script")
    for name, value in (("--nproc-per-node", ranks_per_node), ("--nodes", nodes), ("--steps", steps)):
        if value < 1:
            raise ConfigError(f"{name} {value}: at least 1", hint="e.g. 2")
    profile = None
    if profile_name:
        profile = load_profile(profile_name)
    if workload:
        get_workload(workload)  # an unknown name is refused before the calibration
    net, net_source = network(interconnect, profile)
    if mem:
        parse_mem_gb(mem)  # a size SLURM would refuse is refused before the calibration
    if profile is not None:
        cpus = usable_cpus(profile)
    else:
        cpus = len(current_affinity()) or 1
    import torch  # noqa: PLC0415 (torch-free module)

    here_on_cpu = profile is None and not torch.cuda.is_available()
    # on this machine's CPUs, the calibrating rank gets the threads each planned rank will (`run` gives each
    # rank its share of the cores): a rank's pace on 1 thread is not half its pace on 2
    threads = max(1, cpus // ranks_per_node) if here_on_cpu else None
    cal = calibrate(
        script=script,
        args=args,
        workload=workload,
        batch=batch,
        steps=steps,
        say=say,
        timeout_s=timeout_s,
        threads=threads,
    )
    own = {}

    def own_calibration(name: str, instead: str, **how: Any) -> Calibration | None:
        """One more calibration of the target, one rank; the plan goes on without it when it fails."""
        try:
            return calibrate(
                script=script, args=args, batch=batch, steps=steps, say=say, timeout_s=timeout_s, threads=threads, **how
            )
        except ConfigError as exc:
            cause = [line for line in exc.message.splitlines() if line.strip()][-1]
            say(f"{name}'s own calibration failed ({cause}): its times are {instead}")
            return None

    # one rank runs FSDP unwrapped: its own calibration only matters for a plan of several
    for name, spec in OWN_CALIBRATIONS.items() if workload and ranks_per_node * nodes > 1 else ():
        if only in (None, name) and (found := own_calibration(name, "ddp's pace", workload=workload, strategy=spec)):
            own[name] = found
    if script and ranks_per_node * nodes > 1 and cal.setup and cal.strategy in (None, "none"):
        # rt.setup wraps nothing on one rank: its strategy's own work per step (DDP's forward, its gradient hooks,
        # its buckets) is in the pace only when it wraps the model over a group of one; its peak is the plain one
        if alone := own_calibration(cal.setup, "the unwrapped pace", workload=None, alone=True):
            own[cal.modelled_strategy()] = replace(alone, peak=cal.peak, reserve=cal.reserve)
    sweeps = (
        sweeps_here(ranks_per_node, say, sweep_hooks(args if workload else setup_args(cal), only))
        if here_on_cpu and ranks_per_node > 1
        else []
    )
    device_bytes, device_source = room(profile, ranks_per_node, mem)
    made = make_plan(
        cal,
        what=f"workload {workload}" if workload else " ".join([script, *args]),
        ranks_per_node=ranks_per_node,
        nodes=nodes,
        batch=batch,
        device_bytes=device_bytes,
        device_source=device_source,
        network=net,
        network_source=net_source,
        target_gpus=bool(profile is not None and profile.gpus_per_node),
        shared_cores=cpus if profile is None and not cal.device.startswith("cuda") else None,
        cpus_per_rank=max(1, cpus // ranks_per_node),
        own=own,
        sweeps=sweeps,
    )
    submit = submit_line(
        profile=profile,
        nodes=nodes,
        ranks_per_node=ranks_per_node,
        strategy=made.recommended,
        workload=workload,
        script=script,
        args=args,
        batch=batch,
    )
    if check:
        made.verified = verify(made, script=script, args=args, workload=workload, steps=steps, say=say)
    return made, submit if made.recommended else None


STUDY_CALIBRATION_S = 180.0
"""A study's plan gives up after this long (said in the study; its runs go on): a model too large for where
``bench`` runs (a login node planning a SLURM study) should cost the study minutes, not a quarter of an hour."""


def study_strategy(args: tuple[str, ...]) -> str:
    """The strategy a workload study's arguments ask for, by name (``fsdp:mixed_precision=bf16`` is fsdp); the
    workloads' ddp by default."""
    from trainscale.strategies import parse_spec  # noqa: PLC0415 (torch-free module)

    return parse_spec(option_value(args, "--strategy") or "ddp")[0]


def plan_study(spec, study_plan, say: Callable[[str], None]) -> tuple[Plan | None, str | None]:
    """``trainscale bench``'s plan, made before its runs as ``trainscale plan`` makes it (one rank's short
    calibration here) for the study's largest configuration: (the plan, None), or (None, why there is none)."""
    if spec.sweep_batches:
        return None, "a batch-size sweep is not planned"
    largest = max(study_plan.configs, key=lambda c: (c.nnodes, c.nproc_per_node))
    baseline = next(r for r in study_plan.runs if r.config == study_plan.baseline)
    script_args = tuple(a.replace("{batch}", str(baseline.per_rank_batch)) for a in spec.script_args)
    data = [*(["--data", spec.data] if spec.data else []), *(["--samples", str(spec.samples)] if spec.samples else [])]
    try:
        made, _ = make(
            script=spec.script,
            args=script_args if spec.script else (*data, *spec.workload_args),
            workload=spec.workload,
            profile_name=spec.slurm.cluster.name if spec.slurm else None,
            ranks_per_node=largest.nproc_per_node,
            nodes=largest.nnodes,
            batch=baseline.per_rank_batch,
            interconnect=None,
            steps=10,
            say=say,
            timeout_s=STUDY_CALIBRATION_S,
            only=study_strategy(spec.workload_args) if spec.workload else None,
        )
    except ConfigError as exc:
        return None, exc.message.splitlines()[0]
    return made, None


def against(made: Plan, runs: list[dict], out_dir: Path) -> list[dict]:
    """Each measured configuration of a study beside what its plan predicted: the step (the median of its rank 0's
    step records after the warm-up, as the calibration's), the fullest rank's model state (its memory table) and
    its ranks' largest peak over their training steps."""
    rows = []
    for run in runs:
        if run.get("status") != "ok" or not run.get("run_dir"):
            continue
        found = sorted((out_dir / run["run_dir"]).glob("metrics/rank-*.jsonl"))
        records = list(read_lines(found[0])) if found else []
        metrics = read_metrics(Path(run["metrics_file"])) if run.get("metrics_file") else None
        strategy = run.get("strategy") or "ddp"
        modelled = strategy if strategy in STRATEGIES else "ddp"
        peaks = steps_peaks(out_dir / run["run_dir"])
        row = compare(
            made,
            records,
            metrics,
            peaks,
            ranks=run["world_size"],
            nodes=run["nodes"],
            strategy=modelled,
            batch=run["per_rank_batch"],
        )
        row.update(
            config=run["label"],
            modelled=modelled if modelled == strategy else f"ddp (for {strategy})",
            disturbed=disturbance(run, None),
        )
        rows.append(row)
    return rows
