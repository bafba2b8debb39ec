"""``trainscale plan``'s acting part: the calibration run (one rank, a few steps, launched as ``trainscale run``
launches it, its records read back), the room per rank and the network the plan is made for. The modelling is
bench/plan.py's (pure); the CLI only parses and prints.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from trainscale.bench.plan import Calibration, Plan, make_plan
from trainscale.bench.projection import Network, get_preset
from trainscale.errors import ConfigError

PROFILE_NETWORKS = {"ofi": "slingshot-11", "ib": "ib-hdr200", "socket": "ethernet-25g"}
"""A profile's ``interconnect`` as the projection's preset (the preset's numbers: bench --list-interconnects)."""
DEFAULT_NETWORK = "ethernet-25g"


def short_run(*, script: str | None, args: tuple[str, ...], workload: str | None, batch: int | None, steps: int,
              say: Callable[[str], None], nproc: int = 1, strategy: str | None = None,
              timeout_s: float = 900.0) -> tuple[list[dict], dict | None]:
    """Run the script (or workload) on ``nproc`` ranks here for ``steps`` optimizer steps and more: rank 0's
    records, and a workload's metrics (its memory table). A script runs in the working directory (its relative
    paths) and is stopped after ``steps`` by its recorder (observe/state.py); its rt.checkpoint files go to a
    directory of the run's own (it neither resumes from nor writes into the user's). A workload runs
    ``steps + 1`` steps to its normal end in a temporary directory."""
    from trainscale.observe.state import PLAN_STEPS_VAR
    from trainscale.train.resumable import CHECKPOINT_DIR_VAR

    with tempfile.TemporaryDirectory(prefix="trainscale-plan-") as tmp:
        logs, metrics = Path(tmp) / "runs", Path(tmp) / "metrics.json"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINSCALE_TRAIN_")}
        env.update({CHECKPOINT_DIR_VAR: str(Path(tmp) / "checkpoints"), "TRAINSCALE_RECORD": "1",
                    "TRAINSCALE_HANG_NOTICE": "0"})
        head = [sys.executable, "-m", "trainscale", "run", "--nproc-per-node", str(nproc), "--log-dir", str(logs)]
        if workload:
            from trainscale.workloads.registry import get_workload

            line = [*head, "--workload", workload, *args, *get_workload(workload).batch_args(batch, nproc),
                    *(["--strategy", strategy] if strategy else []), "--epochs", "1000", "--log-every", "0"]
            if nproc == 1:  # the calibration: the state counted, then stopped by the recorder
                env[PLAN_STEPS_VAR] = str(steps)
            else:
                line += ["--max-steps", str(steps + 1), "--metrics-out", str(metrics)]
            cwd = tmp
        else:
            env[PLAN_STEPS_VAR] = str(steps)
            line, cwd = [*head, str(Path(script).absolute()), *args], os.getcwd()
        say(f"{'calibrating' if nproc == 1 else 'verifying'}: {shlex.join(line[3:])} ({nproc} rank(s), "
            f"{steps + 1} optimizer steps)")
        try:
            done = subprocess.run(line, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            said = "the calibration run took more than" if nproc == 1 else "the verification run took more than"
            raise ConfigError(f"{said} {timeout_s:.0f} s for {steps + 1} steps",
                              hint="give fewer --steps, or a smaller batch") from None
        found = sorted(logs.glob("*/metrics/rank-0.jsonl"))
        if done.returncode == 0 and not found:  # it ended by itself before a step: nothing to plan from
            raise ConfigError("the calibration run recorded no optimizer step with parameters: the script ended "
                              "without training", hint="plan needs a script that trains (a torch optimizer's step)")
        if done.returncode != 0 or not found:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            said = "the calibration run failed" if nproc == 1 else "the verification run failed"
            raise ConfigError(f"{said} (exit {done.returncode}):\n{tail}",
                              hint="run the same line with trainscale run to see why")
        records = [json.loads(line) for line in found[0].read_text().splitlines() if line.strip()]
        return records, json.loads(metrics.read_text()) if metrics.exists() else None


def calibrate(*, script: str | None, args: tuple[str, ...], workload: str | None, batch: int | None, steps: int,
              say: Callable[[str], None]) -> Calibration:
    """One rank, ``steps`` optimizer steps: what its state holds and how long its steps take."""
    records, _ = short_run(script=script, args=args, workload=workload, batch=batch, steps=steps, say=say)
    return Calibration.from_records(records)


VERIFIED = ("ddp", "zero1", "fsdp")
"""The strategies ``--verify`` runs for a workload (DeepSpeed's first start compiles for a minute: left out)."""


def verify(plan: Plan, *, script: str | None, args: tuple[str, ...], workload: str | None, steps: int,
           say: Callable[[str], None]) -> list[dict]:
    """``plan --verify``: the cheapest several-rank configuration the plan predicts (2 ranks here; 1 where the plan
    is for one), under each strategy trainscale runs for a workload (a script's own for a script), run here for
    a few steps: the predicted step time and held bytes against the measured ones."""
    import statistics

    from trainscale.bench.plan import memory

    ranks = 2 if plan.world > 1 else 1
    predicted = plan.predict(ranks, 1)
    out = []
    for strategy in (VERIFIED if workload else (None,)):
        records, metrics = short_run(script=script, args=args, workload=workload, batch=plan.batch, steps=steps,
                                     say=say, nproc=ranks, strategy=strategy)
        times = [float(r["step_s"]) for r in records if r.get("kind") == "step" and r.get("step_s")][1:]
        if metrics and metrics.get("memory"):  # the fullest rank, as the plan predicts it (what must fit)
            held = float(max(row["params"] + row["grads"] + row["optimizer"] for row in metrics["memory"]["ranks"]))
        else:
            state = next((r for r in records if r.get("kind") == "state"), None)
            held = float(state["params_bytes"] + state["grads_bytes"] + state["optimizer_bytes"]) if state else None
        modelled = strategy or plan.calibration.modelled_strategy()  # a script's own, as its run showed it
        m = memory(plan.calibration, modelled, ranks, plan.batch)
        want = m.params + m.grads + m.optimizer
        step = statistics.median(times) if times else float("nan")
        out.append({"config": f"{ranks} x {strategy or f'your script ({modelled})'}", "ranks": ranks,
                    "strategy": strategy or modelled,
                    "steps": len(times) + 1, "predicted_step_s": predicted["step_s"], "band_s": predicted["band_s"],
                    "measured_step_s": step, "step_error": step / predicted["step_s"] - 1 if times else None,
                    "predicted_held": want, "measured_held": held,
                    "held_error": held / want - 1 if held is not None and want else None})
    return out


def room(profile, ranks_per_node: int) -> tuple[float | None, str]:
    """Memory one rank may use: the profile's GPU (or its node's share per rank), else this machine's."""
    if profile is not None:
        if profile.gpus_per_node and profile.mem_per_gpu_gb:
            return profile.mem_per_gpu_gb * 2**30, f"profile {profile.name}: {profile.mem_per_gpu_gb:g} GB per GPU"
        if profile.mem_per_node_gb:
            return (profile.mem_per_node_gb * 2**30 / ranks_per_node,
                    f"profile {profile.name}: {profile.mem_per_node_gb:g} GB per node / {ranks_per_node} rank(s)")
        return None, f"profile {profile.name} gives no memory"
    import torch

    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return float(props.total_memory), f"this machine's GPU 0, {props.name}"
    try:
        import psutil

        total = psutil.virtual_memory().total
    except ImportError:
        return None, "psutil is not installed"
    return total / ranks_per_node, f"this machine's {total / 2**30:.1f} GiB / {ranks_per_node} rank(s)"


def network(name: str | None, profile) -> tuple[Network, str]:
    """The interconnect the time model charges: --interconnect, else the profile's, else an assumption said so."""
    if name:
        return get_preset(name).network(), f"--interconnect {name}"
    if profile is not None and PROFILE_NETWORKS.get(profile.interconnect):
        preset = PROFILE_NETWORKS[profile.interconnect]
        return get_preset(preset).network(), f"{preset} (profile {profile.name})"
    return get_preset(DEFAULT_NETWORK).network(), f"{DEFAULT_NETWORK} (assumed: give --interconnect NAME)"


def submit_line(*, profile, nodes: int, ranks_per_node: int, strategy: str | None, workload: str | None,
                script: str | None, args: tuple[str, ...], batch: int | None) -> str:
    """The command that runs the recommended configuration."""
    if workload:
        from trainscale.workloads.registry import get_workload

        target = ["--workload", workload, *args, *(["--strategy", strategy] if strategy else []),
                  *get_workload(workload).batch_args(batch, ranks_per_node * nodes)]
    else:
        target = [script, *args]
    if profile is None and nodes == 1:
        return shlex.join(["trainscale", "run", "--nproc-per-node", str(ranks_per_node), *target])
    if profile is None:  # several nodes need a cluster: name its profile
        line = shlex.join(["trainscale", "slurm", "--profile", "YOURS", "-N", str(nodes), "--gpus-per-node",
                           str(ranks_per_node), "-t", "01:00:00", "--submit", *target])
        return line + "   (--profile: your cluster's, trainscale profiles)"
    head = ["trainscale", "slurm", "--profile", profile.name, "-N", str(nodes), "--gpus-per-node", str(ranks_per_node),
            "-t", "01:00:00", *(["-A", "PROJECT"] if profile.requires_account else []), "--submit"]
    line = shlex.join([*head, *target])
    return line + ("" if workload or not strategy else f"   (the strategy is your script's: rt.setup(..., "
                                                       f"strategy={strategy!r}))")


def make(*, script: str | None, args: tuple[str, ...], workload: str | None, profile_name: str | None,
         ranks_per_node: int, nodes: int, batch: int | None, interconnect: str | None, steps: int,
         say: Callable[[str], None], check: bool = False) -> tuple[Plan, str | None]:
    """``trainscale plan``: the refusals, the calibration, the plan and the line that submits it (None when
    nothing fits: no line that would run out of memory); ``check`` (``--verify``): the cheapest configurations run
    here, predicted against measured."""
    if bool(workload) == bool(script):  # both, or neither
        raise ConfigError("give one thing to plan: --workload NAME or SCRIPT [ARGS]",
                          hint="trainscale plan --workload gpt --nproc-per-node 8, or trainscale plan train.py")
    if script and not Path(script).is_file():
        raise ConfigError(f"script {script} not found", hint="give the path of your training script")
    for name, value in (("--nproc-per-node", ranks_per_node), ("--nodes", nodes), ("--steps", steps)):
        if value < 1:
            raise ConfigError(f"{name} {value}: at least 1", hint="e.g. 2")
    profile = None
    if profile_name:
        from trainscale.profiles import load_profile

        profile = load_profile(profile_name)
    if workload:
        from trainscale.workloads.registry import get_workload

        get_workload(workload)  # an unknown name is refused before the calibration
    net, net_source = network(interconnect, profile)
    cal = calibrate(script=script, args=args, workload=workload, batch=batch, steps=steps, say=say)
    device_bytes, device_source = room(profile, ranks_per_node)
    if profile is not None:
        from trainscale.launch.slurm.spec import usable_cpus

        cpus = usable_cpus(profile)
    else:
        from trainscale.topology.apply import current_affinity

        cpus = len(current_affinity()) or 1
    made = make_plan(cal, what=f"workload {workload}" if workload else " ".join([script, *args]),
                     ranks_per_node=ranks_per_node, nodes=nodes, batch=batch, device_bytes=device_bytes,
                     device_source=device_source, network=net, network_source=net_source,
                     target_gpus=bool(profile is not None and profile.gpus_per_node),
                     shared_cores=cpus if profile is None and not cal.device.startswith("cuda") else None,
                     cpus_per_rank=max(1, cpus // ranks_per_node))
    submit = submit_line(profile=profile, nodes=nodes, ranks_per_node=ranks_per_node, strategy=made.recommended,
                         workload=workload, script=script, args=args, batch=batch)
    if check:
        made.verified = verify(made, script=script, args=args, workload=workload, steps=steps, say=say)
    return made, submit if made.recommended else None

