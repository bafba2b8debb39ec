"""Sweeps: a grid of configurations run as one SLURM job array (or one after another on this node),
each configuration in its own directory, and one results table gathered from what the tasks wrote.

    <run>/sweep.json        the grid, the configurations in order, the array job ids
    <run>/tasks/<i>.args    task i's extra arguments, one per line (read by the batch script)
    <run>/task-<i>/         task i's directory: checkpoints/, metrics.json, finished | failed
    <run>/results.csv|.md|.png   written by `trainscale sweep status`

A task's metrics are the last value of each key it logged with ``rt.log`` (``metrics.csv`` in its directory,
the csv tracker's), and what it writes to ``$TRAINSCALE_RUN_DIR/metrics.json``: the built-in workloads write
their result (the last epoch's losses and accuracy are taken), a script a flat JSON object.
"""

from __future__ import annotations

import csv
import dataclasses
import itertools
import json
import math
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainscale.config import read_toml
from trainscale.errors import ConfigError, SlurmError
from trainscale.launch.local import LocalLaunchSpec, launch
from trainscale.launch.slurm.job import make_jobs_folder, submit_job
from trainscale.launch.slurm.queue import sacct, squeue

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")
PREFERRED_METRICS = ("test_loss", "val_loss", "eval_loss", "loss", "train_loss")


def parse_grid(text: str) -> dict[str, list[str]]:
    """``'lr=1e-3,3e-4 batch_size=16,32'`` -> ``{"lr": ["1e-3", "3e-4"], "batch_size": ["16", "32"]}``."""
    grid: dict[str, list[str]] = {}
    for part in text.split():
        key, sep, values = part.partition("=")
        items = [v for v in values.split(",") if v]
        if not sep or not _KEY.match(key) or not items:
            raise ConfigError(
                f"--grid {part!r} is not KEY=V1,V2,...",
                hint="e.g. --grid 'lr=1e-3,3e-4 batch_size=16,32' (one KEY=VALUES per word)",
            )
        if key in grid:
            raise ConfigError(f"--grid names {key!r} twice", hint="give each key once, with all its values")
        grid[key] = items
    if not grid:
        raise ConfigError("--grid is empty", hint="e.g. --grid 'lr=1e-3,3e-4'")
    return grid


def load_grid_file(path: str | Path) -> dict[str, list[str]]:
    """A TOML file: ``[grid]`` with a list per key, e.g. ``lr = [1e-3, 3e-4]``."""
    data = read_toml(path, "grid file", "give a TOML file with a [grid] table")
    table = data.get("grid")
    if not isinstance(table, dict) or not table:
        raise ConfigError(f"grid file {path} has no [grid] table", hint="[grid]\nlr = [1e-3, 3e-4]")
    grid = {}
    for key, values in table.items():
        values = values if isinstance(values, list) else [values]
        if not _KEY.match(key) or not values:
            raise ConfigError(
                f"grid file {path}: {key!r} = {values!r} is not a key with values", hint="e.g. batch_size = [16, 32]"
            )
        grid[key] = [json.dumps(v) if isinstance(v, bool) else str(v) for v in values]
    return grid


def grid_of(grid: str | None, grid_file: str | None) -> dict[str, list[str]]:
    """The grid of ``--grid`` or of ``--grid-file`` (exactly one of them)."""
    if bool(grid) == bool(grid_file):
        raise ConfigError(
            "give exactly one of --grid or --grid-file", hint="e.g. --grid 'lr=1e-3,3e-4 batch_size=16,32'"
        )
    return parse_grid(grid) if grid else load_grid_file(grid_file)


def array_range(count: int, max_parallel: int | None, *, option: str) -> str:
    """sbatch's ``--array`` for ``count`` tasks, at most ``max_parallel`` running at once; ``option`` is how the
    caller spells max_parallel (``--max-parallel `` or ``max_parallel=``)."""
    if max_parallel is not None and max_parallel < 1:
        raise ConfigError(f"{option}{max_parallel} must be at least 1", hint=f"e.g. {option}2")
    return f"0-{count - 1}" + (f"%{max_parallel}" if max_parallel else "")


def array_job(spec: Any, grid: dict[str, list[str]], max_parallel: int | None) -> Any:
    """The job spec as the sweep's one array job: a task per configuration of ``grid``."""
    array = array_range(len(configurations(grid)), max_parallel, option="--max-parallel ")
    return dataclasses.replace(spec, array=array, sweep=True)


def configurations(grid: dict[str, list[str]]) -> list[dict[str, str]]:
    """Every combination, the first key varying slowest."""
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def task_args(config: dict[str, str], *, workload: bool, task_dir: str) -> list[str]:
    """A configuration as command-line options: ``batch_size=16`` -> ``--batch_size 16`` (the key as you
    wrote it; a workload takes ``--batch-size``), plus a workload's own checkpoint and metrics files."""
    args = []
    for key, value in config.items():
        args += [f"--{key.replace('_', '-') if workload else key}", value]
    if workload:
        args += ["--checkpoint-dir", f"{task_dir}/checkpoints", "--metrics-out", f"{task_dir}/metrics.json"]
    return args


def write_tasks(run_dir: Path, grid: dict[str, list[str]], *, workload: bool) -> list[dict[str, str]]:
    """sweep.json and tasks/<i>.args; returns the configurations."""
    configs = configurations(grid)
    tasks = run_dir / "tasks"
    tasks.mkdir(parents=True, exist_ok=True)
    for i, config in enumerate(configs):
        # $TASK_DIR is the batch script's; a workload's files go into the task's own directory
        args = task_args(config, workload=workload, task_dir=str(run_dir / f"task-{i}"))
        (tasks / f"{i}.args").write_text("".join(a + "\n" for a in args))
    (run_dir / "sweep.json").write_text(json.dumps({"grid": grid, "configurations": configs, "jobs": []}, indent=2))
    return configs


@dataclass(frozen=True)
class TaskResult:
    index: int
    config: dict[str, str]
    state: str
    """finished, failed (exit code), or for a task with no result yet the scheduler's state (running, pending
    (reason), cancelled, ...); pending for a sweep run here whose task has not run."""
    metrics: dict[str, float]


def _flat_metrics(data: Any) -> dict[str, float]:
    if not isinstance(data, dict):
        return {}
    source = data
    epochs = data.get("epochs")
    if isinstance(epochs, list) and epochs and isinstance(epochs[-1], dict):  # a built-in workload's result
        source = {**epochs[-1], "steps": data.get("steps")}
    return {
        k: float(v)
        for k, v in source.items()
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))
    }


def _logged(path: Path) -> dict[str, float]:
    """The last value of each key ``rt.log`` wrote to a task's metrics.csv (step,key,value,time rows)."""
    last: dict[str, float] = {}
    try:
        with open(path, newline="") as fh:
            for row in csv.reader(fh):
                try:
                    value = float(row[2])
                except (IndexError, ValueError):
                    continue  # the header, a cut line
                if math.isfinite(value):
                    last[row[1]] = value
    except OSError:
        pass
    return last


def scheduler_states(job_id: str, tasks: list[int], run: Any = None) -> dict[int, str]:
    """What the scheduler says of an array job's ``tasks`` that left no result: the queue's state (``running``,
    ``pending (Resources)``) while they are in it, then their accounting's (``cancelled``, ``node_fail``), each
    from one call for the whole array (a 1,000-task sweep is two commands, not thousands); a task neither knows
    is left out. No scheduler here: nothing."""
    try:
        live = {j.job_id: j for j in squeue(run, job_id=job_id, array=True)}
    except SlurmError:
        return {}
    out = {}
    for i in tasks:
        info = live.get(f"{job_id}_{i}")
        if info is not None:
            out[i] = info.state.lower() + (f" ({info.reason})" if info.reason and info.state == "PENDING" else "")
    gone = [i for i in tasks if i not in out]
    if gone:
        try:
            states = {r.job_id: r.state for r in sacct(job_id, run)}
        except SlurmError:
            return out
        for i in gone:
            if f"{job_id}_{i}" in states:
                out[i] = states[f"{job_id}_{i}"].lower()
    return out


def gather(run_dir: Path, run: Any = None) -> list[TaskResult]:
    path = Path(run_dir) / "sweep.json"
    if not path.exists():
        raise ConfigError(
            f"{run_dir} is not a sweep's run directory (no sweep.json)",
            hint="give the directory `trainscale sweep` printed when it submitted the sweep",
        )
    sweep = json.loads(path.read_text())
    configs = sweep["configurations"]
    ended = {
        i
        for i in range(len(configs))
        if any((Path(run_dir) / f"task-{i}" / m).exists() for m in ("finished", "failed"))
    }
    jobs = sweep.get("jobs") or []  # a sweep run here has none: a task without a result has not run yet
    asked = scheduler_states(jobs[-1], [i for i in range(len(configs)) if i not in ended], run) if jobs else {}
    out = []
    for i, config in enumerate(configs):
        task = Path(run_dir) / f"task-{i}"
        if (task / "finished").exists():
            state = "finished"
        elif (task / "failed").exists():
            state = "failed (" + (task / "failed").read_text().strip() + ")"
        else:
            state = asked.get(i, "pending" if not jobs else "not in the queue, no result")
        metrics = _logged(task / "metrics.csv")
        try:
            metrics |= _flat_metrics(json.loads((task / "metrics.json").read_text()))
        except (OSError, json.JSONDecodeError):
            pass
        out.append(TaskResult(index=i, config=config, state=state, metrics=metrics))
    return out


def choose_metric(results: list[TaskResult], metric: str | None) -> str | None:
    names = {k for r in results for k in r.metrics}
    if metric:
        if metric not in names and not any(r.state.startswith(("finished", "failed")) for r in results):
            return None  # nothing has ended, nothing logged yet: the table without a ranking
        if metric not in names:
            raise ConfigError(
                f"no task of the sweep logged the metric {metric!r}",
                hint=f"logged: {', '.join(sorted(names))}"
                if names
                else f"log it in the script, rt.log({{{metric!r}: value}}), or write it to "
                "$TRAINSCALE_RUN_DIR/metrics.json",
            )
        return metric
    return next((m for m in PREFERRED_METRICS if m in names), None)


def ranked(results: list[TaskResult], metric: str | None, higher_is_better: bool = False) -> list[TaskResult]:
    """Best first by ``metric``, the finished tasks before the others (a failed or running task's value is not
    its result); tasks without it after, in their order."""
    if metric is None:
        return list(results)
    have = [r for r in results if metric in r.metrics]
    rest = [r for r in results if metric not in r.metrics]
    sign = -1 if higher_is_better else 1
    return sorted(have, key=lambda r: (r.state != "finished", sign * r.metrics[metric])) + rest


def table(results: list[TaskResult], metric: str | None) -> tuple[list[str], list[list[str]]]:
    keys = list(results[0].config) if results else []
    shown = sorted({k for r in results for k in r.metrics})
    if metric in shown:
        shown.remove(metric)
        shown.insert(0, metric)
    header = ["task", *keys, "state", *shown]
    rows = [
        [
            str(r.index),
            *(r.config[k] for k in keys),
            r.state,
            *(f"{r.metrics[m]:.6g}" if m in r.metrics else "-" for m in shown),
        ]
        for r in results
    ]
    return header, rows


def write_results(run_dir: Path, header: list[str], rows: list[list[str]]) -> dict[str, Path]:
    run_dir = Path(run_dir)
    with open(run_dir / "results.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([header, *rows])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    (run_dir / "results.md").write_text("\n".join(lines) + "\n")
    return {"csv": run_dir / "results.csv", "markdown": run_dir / "results.md"}


def status(run_dir: Path, metric: str | None, higher_is_better: bool) -> list[str]:
    """``trainscale sweep status``: the table, best first, and a line naming the results files it writes."""
    results = gather(run_dir)
    metric = choose_metric(results, metric)
    header, rows = table(ranked(results, metric, higher_is_better), metric)
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)) for row in (header, *rows)]
    files = write_results(run_dir, header, rows)
    png = plot(run_dir, results, metric, higher_is_better)
    done = sum(r.state == "finished" for r in results)
    return lines + [
        f"\n{done} of {len(results)} task(s) finished"
        + (f"; best first by {metric}" if metric else "")
        + f". Written: {files['csv']}, {files['markdown']}"
        + (f", {png}" if png else "")
    ]


PLOT_TASKS = 30
"""The plot shows the best this many tasks: a bar per task of a 1,024-task sweep is unreadable, and drawing
1,024 labelled bars took 16 s (benchmarks/rank_costs.py); the table and CSV have every task."""


def plot(run_dir: Path, results: list[TaskResult], metric: str | None, higher_is_better: bool = False) -> Path | None:
    """A bar per task of ``metric`` for the best :data:`PLOT_TASKS` tasks, best first, when matplotlib is
    installed and a metric is known."""
    ranked_have = [r for r in ranked(results, metric, higher_is_better) if metric and metric in r.metrics]
    have = ranked_have[:PLOT_TASKS]
    if len(have) < 2:
        return None
    try:
        import matplotlib  # noqa: PLC0415 (optional dependency)

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415 (optional dependency)
    except ImportError:
        return None
    labels = [" ".join(f"{k}={v}" for k, v in r.config.items()) for r in have]
    fig, ax = plt.subplots(figsize=(max(6, len(have) * 0.9), 4))
    ax.bar(range(len(have)), [r.metrics[metric] for r in have], color="#4477aa")
    ax.set_xticks(range(len(have)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel(metric)
    best = f"the best {len(have)} of {len(ranked_have)} tasks" if len(have) < len(ranked_have) else "best first"
    ax.set_title(f"sweep {Path(run_dir).name}: {metric}, {best}")
    fig.tight_layout()
    path = Path(run_dir) / "results.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def submit_array(spec: Any, profile: Any, plan: Any, grid: dict[str, list[str]]) -> tuple[Any, Path, int]:
    """Submit the array job as ``trainscale slurm --submit`` submits a job, the tasks' arguments written into
    its run directory first: (the job's record, the run directory, the task count)."""
    record = submit_job(
        spec, profile, plan, before_submit=lambda plan: write_tasks(plan.run_dir, grid, workload=bool(spec.workload))
    )
    sweep = Path(record.run_dir) / "sweep.json"
    data = json.loads(sweep.read_text())
    sweep.write_text(json.dumps({**data, "jobs": data.get("jobs", []) + [record.job_id]}, indent=2))
    return record, Path(record.run_dir), len(configurations(grid))


def run_here(spec: Any, grid: dict[str, list[str]], *, nproc_per_node: int, say: Any) -> tuple[Path, int]:
    """``trainscale sweep --local``: one configuration after another on this node, each launched as
    ``trainscale run`` launches it, in its own ``task-I/``: (the run directory, how many failed)."""
    run_dir = Path(spec.output_dir).absolute() / (spec.run_name or f"{spec.name}-{time.strftime('%Y%m%d-%H%M%S')}")
    if run_dir.exists():
        raise ConfigError(f"{run_dir} exists", hint="wait a second, or give another --output-dir")

    make_jobs_folder(run_dir.parent)
    run_dir.mkdir()
    configs = write_tasks(run_dir, grid, workload=bool(spec.workload))
    target, module = (
        ("trainscale.workloads", True)
        if spec.workload
        else (spec.module, True)
        if spec.module
        else (spec.script, False)
    )
    head = (spec.workload,) if spec.workload else ()
    failed = 0
    for i, config in enumerate(configs):
        task = run_dir / f"task-{i}"
        task.mkdir(exist_ok=True)
        extra = (run_dir / "tasks" / f"{i}.args").read_text().splitlines()
        say(f"task {i}/{len(configs)}: " + " ".join(f"{k}={v}" for k, v in config.items()))
        result = launch(
            LocalLaunchSpec(
                target=target,
                module=module,
                args=(*head, *spec.args, *extra),
                nproc_per_node=nproc_per_node,
                log_dir=task / "logs",
                env={"TRAINSCALE_RUN_DIR": str(task)},
            )
        )
        if result.ok:
            (task / "finished").write_text(time.strftime("%Y-%m-%dT%H:%M:%S\n"))
        else:
            failed += 1
            try:  # the run's own words: who failed first and how (its exit code), as `trainscale run` says it
                why = json.loads((task / "run.json").read_text())["failure"][0]
            except (OSError, ValueError, KeyError, IndexError, TypeError):
                why = "launch failed"  # no run.json: it never started
            (task / "failed").write_text(why + "\n")
            say(result.summary)
    return run_dir, failed
