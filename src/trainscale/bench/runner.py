"""Run a planned study, through the local launcher or as SLURM jobs, and collect one record per run."""

from __future__ import annotations

import os
from pathlib import Path

from trainscale.bench import results
from trainscale.bench.display import Row, StudyDisplay
from trainscale.bench.study import BATCH_ENV, Plan, PlannedRun, read_metrics
from trainscale.launch.trial import here, on_slurm
from trainscale.observe.reading import other_work, run_timing


def _target(spec_plan: Plan, run: PlannedRun, run_dir: Path) -> tuple[str, bool, tuple[str, ...], dict[str, str]]:
    """(target, is a module, arguments, environment) of one run; a workload writes its results to run_dir (its
    timing, as a script's, is in the run's step records)."""
    metrics = run_dir / "metrics.json"
    env = {BATCH_ENV: str(run.per_rank_batch)}
    spec = spec_plan.spec
    if spec.workload:
        return "trainscale.workloads", True, (spec.workload, *run.args, "--metrics-out", str(metrics.absolute())), env
    return str(Path(spec.script).absolute()), False, tuple(run.args), env


def job_specs(spec_plan: Plan, out_dir: Path) -> dict:
    """run name -> the SlurmJobSpec of each run (``--slurm``): what ``trainscale slurm`` would submit for it."""
    target = spec_plan.spec.slurm
    specs = {}
    for run in spec_plan.runs:
        run_dir = (out_dir / "runs" / run.name).absolute()
        module, is_module, args, env = _target(spec_plan, run, run_dir)
        specs[run.name] = target.job(
            name=f"bench-{run.name}",
            nodes=run.config.nnodes,
            ranks_per_node=run.config.nproc_per_node,
            output_dir=run_dir / "job",
            module=module if is_module else None,
            script=None if is_module else module,
            args=args,
            env=env,
            command_line=("trainscale", "bench", "--slurm", "run", run.name),
        )
    return specs


def base_record(run: PlannedRun) -> dict:
    c = run.config
    return {
        "name": run.name,
        "config": c.token,
        "label": c.label,
        "world_size": c.world_size,
        "nodes": c.nnodes,
        "nproc_per_node": c.nproc_per_node,
        "device": "cuda" if c.gpus and c.device != "cpu" else "cpu",
        "per_rank_batch": run.per_rank_batch,
        "global_batch": run.global_batch,
        "max_steps": run.max_steps,
        "args": list(run.args),
        "sweep": run.sweep,
    }


def execute_run(plan: Plan, run: PlannedRun, out_dir: Path, display: StudyDisplay, jobs: dict | None = None) -> dict:
    """Launch one run (locally, or as its prepared SLURM job in ``jobs``) and turn its metrics into a record."""
    run_dir = out_dir / "runs" / run.name
    run_dir.mkdir(parents=True, exist_ok=True)
    record = base_record(run)
    display.start(run.name)
    if jobs is not None:
        job = jobs[run.name]
        done = on_slurm(
            job.spec,
            plan.spec.slurm.cluster,
            job.plan,
            poll_s=plan.spec.slurm.poll_s,
            say=lambda text: display.line(run.name, text),
        )
        # the job's run directory (made at submission inside runs/<name>/job/) holds its records
        record.update(slurm_job=done.job_id, log_dir=str(done.run_dir), run_dir=_relative(done.run_dir.parent, out_dir))
    else:
        target, module, args, env = _target(plan, run, run_dir)  # as `trainscale run` would launch it
        record["load_before"] = _load()
        with display.capture(run.name):  # one directory: metrics.json, records, logs, run.json
            done = here(
                target, args, module=module, nproc=run.config.nproc_per_node, run_dir=run_dir, env=env, quiet=False
            )
        record["log_dir"] = str(done.run_dir) if done.run_dir else None
        record["run_dir"] = _relative(run_dir, out_dir)  # where `trainscale report` finds its records
    ok, seconds, summary = done.ok, done.seconds, done.summary
    record.update(launch_s=seconds, metrics_file=str(run_dir / "metrics.json"))
    if not ok:
        record.update(status="failed", failure=summary, **results.record_from_launch(seconds))
        (run_dir / "failure.txt").write_text(summary + "\n")
        display.finish(run.name, False, "see " + str(run_dir / "failure.txt"))
        return record
    timing = run_timing(out_dir / record["run_dir"])  # the records: a workload's and a plain script's alike
    if timing is None:
        record.update(status="ok", **results.record_from_launch(seconds))
        display.finish(run.name, True, "no step recorded: whole launch timed")
        return record
    metrics = read_metrics(run_dir / "metrics.json")
    record.update(status="ok", **results.record_from_run(timing, metrics))
    record["nodes"] = (metrics or {}).get("num_nodes", record["nodes"])
    record["device"] = (metrics or {}).get("device", record["device"])
    record["other_cpu_share"] = other_work(out_dir / record["run_dir"]) if record["nodes"] == 1 else None
    rate = f", {record['samples_per_s']:.0f} samples/s" if record.get("samples_per_s") else ""
    display.finish(run.name, True, f"{record['runtime_s']:.1f}s{rate}")
    return record


def _relative(path: Path, root: Path) -> str:
    """A run's directory as the study records it: relative to the study, so a moved study still reads."""
    try:
        return str(Path(path).absolute().relative_to(Path(root).absolute()))
    except ValueError:
        return str(Path(path).absolute())


def _load() -> float | None:
    """1-minute load average: other work on the machine makes every timing here unreliable."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def execute(plan: Plan, out_dir: Path, *, verbose: bool = False, console=None, jobs: dict | None = None) -> list[dict]:
    where = f" (SLURM jobs, profile {plan.spec.slurm.profile})" if jobs is not None else ""
    title = f"trainscale bench: {plan.spec.target}{where} -> {out_dir}"
    epochs = plan.spec.epochs if plan.spec.workload else None
    rows = [Row(r.name, r.config.label, r.config.world_size, r.per_rank_batch, epochs) for r in plan.runs]
    records = []
    with StudyDisplay(title, rows, verbose=verbose, console=console) as display:
        for run in plan.runs:
            records.append(execute_run(plan, run, out_dir, display, jobs))
    return records
