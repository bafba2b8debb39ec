"""One call from spec to files: plan, run every configuration, compare, plot, write."""

from __future__ import annotations

import datetime
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from trainscale.bench import environment, results, validity
from trainscale.bench import plots as plotting
from trainscale.bench.ideal import add_achievable
from trainscale.bench.runner import execute, job_specs
from trainscale.bench.slurm_runs import prepare
from trainscale.bench.study import StudySpec, choose_out_dir, plan
from trainscale.launch.rundir import command_line, mark_latest
from trainscale.plan.calibrate import against, plan_study


@dataclass
class Outcome:
    out_dir: Path
    study: dict
    files: dict[str, Path]
    plots: dict[str, str]
    missing: tuple[str, ...] = ()
    """Optional parts left out, each with how to get it (``pip install matplotlib``)."""

    @property
    def ok(self) -> bool:
        return all(r.get("status") == "ok" for r in self.study["runs"])

    def failures(self) -> list[str]:
        """Each failed run with what it said, for stderr."""
        return [
            f"\n{r['name']} ({r['label']}) failed:\n{r.get('failure', '')}"
            for r in self.study["runs"]
            if r.get("status") != "ok"
        ]

    def summary(self, *, sweep: bool) -> list[str]:
        """What ``trainscale bench`` prints when the study is done: the table, its caveats, the files written."""
        study = self.study
        lines = ["", results.sweep_table(study) if sweep else results.markdown_table(study), "", *validity.notes(study)]
        lines += [
            f"{label}: {text}" if label else text
            for label, text in results.caveats(study)
            if not (sweep and label == "Shared hardware")
        ]  # a sweep's table has no speedups
        return lines + [f"{name:>10}: {path}" for name, path in (*self.files.items(), *self.plots.items())]


def run_study(spec: StudySpec, *, make_plots: bool = True, verbose: bool = False, console=None) -> Outcome:
    the_plan = plan(spec)  # every configuration error surfaces here, before anything launches
    out_dir = choose_out_dir(spec.out_dir)

    jobs = None
    if spec.slurm is not None:  # every job linted before the first is submitted
        jobs = prepare(spec.slurm, job_specs(the_plan, out_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    mark_latest(out_dir)  # bench-out/latest: what `trainscale report bench-out/latest` reads next
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")

    # the plan first, as `trainscale plan` makes it, so that every study shows the model's error
    made, no_plan = plan_study(
        spec, the_plan, say=lambda line: print(f"trainscale bench: plan: {line}", file=sys.stderr, flush=True)
    )
    runs = execute(the_plan, out_dir, verbose=verbose, console=console, jobs=jobs)
    study = {
        "target": spec.target,
        "baseline": the_plan.baseline.token,
        "environment": environment.collect(),
        "spec": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(spec).items()},
        "started_at": started,
        "command": command_line(),
        "runs": runs,
    }
    study["plan"] = (
        {**made.as_dict(), "against": against(made, runs, out_dir)} if made is not None else {"error": no_plan}
    )
    results.add_speedups(runs, the_plan.baseline.token)
    study["shared_hardware"] = _achievable(study, spec)
    validity.assess(runs, the_plan.baseline.token, cores=study["environment"].get("cores"))
    # the measurements are on disk before the plots: a missing package costs only the plots, never the study
    files = results.write_all(out_dir, study, {})
    plot_paths: dict[str, str] = {}
    missing: list[str] = []
    if make_plots and not plotting.available():
        missing.append(f"{plotting.MISSING}: pip install matplotlib (then `trainscale report {out_dir}` draws them)")
    elif make_plots:
        plot_paths = plotting.make_all(study, out_dir)
    files = results.write_all(out_dir, study, plot_paths)
    return Outcome(out_dir, study, files, plot_paths, tuple(missing))


def _achievable(study: dict, spec: StudySpec) -> str | None:
    """Each run's achievable speedup (bench/ideal.py): this machine's cores, or the SLURM profile's nodes."""
    if spec.slurm is not None:
        profile = spec.slurm.cluster
        cores = max(1, profile.cpus_per_node - len(profile.reserved_cores))
        return add_achievable(
            study["runs"], study["baseline"], cores_per_node=cores, nodes_share_cores=profile.shares_cores
        )
    threads = os.environ.get("OMP_NUM_THREADS")  # the launches keep a user's setting (launch/local.py)
    return add_achievable(
        study["runs"],
        study["baseline"],
        cores_per_node=study["environment"]["cores"],
        threads_per_rank=int(threads) if threads and threads.isdigit() else None,
    )
