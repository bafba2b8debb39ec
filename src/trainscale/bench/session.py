"""One call from spec to files: plan, run every configuration, compare, project, plot, write."""

from __future__ import annotations

import datetime
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from trainscale.bench import environment, plots as plotting, results, validity
from trainscale.bench.study import StudySpec, choose_out_dir, plan
from trainscale.launch.rundir import command_line, mark_latest
from trainscale.errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class ProjectionRequest:
    """``--project-to N --interconnect PRESET|measured``."""

    project_to: int
    """Largest rank count to predict."""
    interconnect: str = "measured"
    """A preset name (``trainscale bench --list-interconnects``) or ``measured`` (this machine's all-reduce)."""
    links_per_node: int | None = None
    """Override the preset's links (NICs) per node."""
    overlap: float = 1.0
    """Fraction of backward that can hide gradient communication."""

    def __post_init__(self) -> None:
        if self.project_to < 2:
            raise ConfigError(f"--project-to {self.project_to} must be >= 2", hint="e.g. --project-to 1024")
        if self.interconnect != "measured":
            from trainscale.bench.projection import get_preset

            get_preset(self.interconnect, self.links_per_node)


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
        return [f"\n{r['name']} ({r['label']}) failed:\n{r.get('failure', '')}" for r in self.study["runs"]
                if r.get("status") != "ok"]

    def summary(self, *, sweep: bool) -> list[str]:
        """What ``trainscale bench`` prints when the study is done: the table, its caveats, the files written."""
        study = self.study
        lines = ["", results.sweep_table(study) if sweep else results.markdown_table(study), "", *validity.notes(study)]
        lines += [f"{label}: {text}" if label else text for label, text in results.caveats(study)
                  if not (sweep and label == "Shared hardware")]  # a sweep's table has no speedups
        if study.get("projection_error"):
            lines.append(f"No projection: {study['projection_error']}")
        return lines + [f"{name:>10}: {path}" for name, path in (*self.files.items(), *self.plots.items())]


def projection_request(*, project_to: int | None, interconnect: str | None, links_per_node: int | None,
                       overlap: float) -> ProjectionRequest | None:
    """``--project-to``/``--interconnect`` (either asks for a projection; the other defaults), or None."""
    if project_to is None and interconnect is None:
        return None
    return ProjectionRequest(project_to=project_to or 1024, interconnect=interconnect or "measured",
                             links_per_node=links_per_node, overlap=overlap)


def run_study(spec: StudySpec, *, projection: ProjectionRequest | None = None, validate: bool = False,
              make_plots: bool = True, verbose: bool = False, console=None) -> Outcome:
    the_plan = plan(spec)  # every configuration error surfaces here, before anything launches
    if projection and spec.sweep_batches:
        raise ConfigError("--project-to does not apply to a batch-size sweep", hint="drop --sweep-batch or --project-to")
    if (projection or validate) and not any(c.world_size == 1 for c in the_plan.configs):
        raise ConfigError("a projection starts from a measured single-rank run, and --configs has none",
                          hint="add 1 (or cpu) to --configs")
    if projection and projection.interconnect == "measured" and not any(c.world_size > 1 for c in the_plan.configs):
        raise ConfigError("--interconnect measured takes the all-reduce bandwidth from a multi-rank configuration, "
                          "and --configs has none", hint="add 2 to --configs, or name a preset such as ib-hdr200")
    out_dir = choose_out_dir(spec.out_dir)
    from trainscale.bench.runner import execute, job_specs

    jobs = None
    if spec.slurm is not None:  # every job linted before the first is submitted
        from trainscale.bench.slurm_runs import prepare

        jobs = prepare(spec.slurm, job_specs(the_plan, out_dir))
    out_dir.mkdir(parents=True, exist_ok=True)
    mark_latest(out_dir)  # bench-out/latest: what `trainscale report bench-out/latest` reads next
    started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    from trainscale.bench.planning import against, plan_study

    # the plan first, as `trainscale plan` makes it, so that every study shows the model's error
    made, no_plan = plan_study(spec, the_plan, say=lambda line: print(f"trainscale bench: plan: {line}",
                                                                      file=sys.stderr, flush=True))
    runs = execute(the_plan, out_dir, verbose=verbose, console=console, jobs=jobs)
    study = {"target": spec.target, "baseline": the_plan.baseline.token, "environment": environment.collect(),
             "spec": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(spec).items()},
             "started_at": started, "command": command_line(), "runs": runs}
    study["plan"] = ({**made.as_dict(), "against": against(made, runs, out_dir)} if made is not None
                     else {"error": no_plan})
    results.add_speedups(runs, the_plan.baseline.token)
    study["shared_hardware"] = _achievable(study, spec)
    validity.assess(runs, the_plan.baseline.token, cores=study["environment"].get("cores"))
    # the measurements are on disk before anything optional runs (projection, plots): a missing package
    # or a failed all-reduce benchmark costs only its own part, never the study
    files = results.write_all(out_dir, study, {})
    try:
        _predict(study, spec, out_dir, projection, validate)
    except ConfigError as exc:
        study["projection_error"] = exc.message
    plot_paths: dict[str, str] = {}
    missing: list[str] = []
    if make_plots and not plotting.available():
        missing.append(f"{plotting.MISSING}: pip install matplotlib (then `trainscale report {out_dir}` "
                       "draws them)")
    elif make_plots:
        plot_paths = plotting.make_all(study, out_dir)
    files = results.write_all(out_dir, study, plot_paths)
    return Outcome(out_dir, study, files, plot_paths, tuple(missing))


def _achievable(study: dict, spec: StudySpec) -> str | None:
    """Each run's achievable speedup (bench/ideal.py): this machine's cores, or the SLURM profile's nodes."""
    import os

    from trainscale.bench.ideal import add_achievable

    if spec.slurm is not None:
        profile = spec.slurm.cluster
        cores = max(1, profile.cpus_per_node - len(profile.reserved_cores))
        return add_achievable(study["runs"], study["baseline"], cores_per_node=cores,
                              nodes_share_cores=profile.shares_cores)
    threads = os.environ.get("OMP_NUM_THREADS")  # the launches keep a user's setting (launch/local.py)
    return add_achievable(study["runs"], study["baseline"], cores_per_node=study["environment"]["cores"],
                          threads_per_rank=int(threads) if threads and threads.isdigit() else None)


def _predict(study: dict, spec: StudySpec, out_dir: Path, projection: ProjectionRequest | None, validate: bool) -> None:
    from trainscale.bench import allreduce_run, predictions
    from trainscale.bench.projection import get_preset

    if not (projection or validate) or not any(r.get("breakdown") for r in study["runs"]):
        return
    try:
        predictions.source_run(study["runs"], study["baseline"])
    except ConfigError as exc:
        study["projection_error"] = str(exc)
        return
    hook = predictions.averaging_hook(spec.workload_args)  # what the runs' DDP averaged with

    def measure(n: int, sizes: str) -> dict:  # n ranks on one node, here or as one SLURM job
        return allreduce_run.measure(spec.slurm, nproc=n, sizes=sizes, out_file=out_dir / f"allreduce-{n}.json",
                                     logs=out_dir / "runs" / f"allreduce-{n}", iters=30, budget_s=2.0, hook=hook,
                                     name=f"bench-allreduce-{n}")
    if validate or (projection and projection.interconnect == "measured"):
        checked = predictions.validate(study, measure)
        # the model's error where only the training ran (all runs' where other work disturbed every one)
        counted = [r for r in checked if not predictions.disturbed(r)] or checked
        errors = [abs(r["prediction"]["error"]) for r in counted]
        plain = [abs(r["prediction"]["uncalibrated_error"]) for r in counted]
        source = predictions.source_run(study["runs"], study["baseline"])
        study["validation"] = {"runs": [r["config"] for r in counted],
                               "disturbed": {r["config"]: r["other_cpu_share"] for r in checked
                                             if predictions.disturbed(r)},
                               "source_disturbed": (source.get("other_cpu_share") if predictions.disturbed(source)
                                                    else None),
                               "calibrated": any(r["prediction"]["calibrated_on"] for r in checked),
                               "mean_abs_error": sum(errors) / len(errors) if errors else None,
                               "mean_abs_error_uncalibrated": sum(plain) / len(plain) if plain else None,
                               # epochs each run's steady state is the median of (the fewest of any run)
                               "steady_epochs": min(((r.get("steady") or {}).get("epochs", 0) for r in study["runs"]
                                                     if r.get("status") == "ok"), default=0)}
    if projection:
        if projection.interconnect == "measured":
            checked = [r for r in study["runs"] if r.get("prediction")]
            if not checked:
                raise ConfigError("--interconnect measured needs a measured multi-rank run to take busbw from",
                                  hint="add 2 to --configs, or name a preset such as ib-hdr200")
            from trainscale.bench.projection import Network

            net = Network(**max(checked, key=lambda r: r["world_size"])["prediction"]["network"])
        else:
            net = get_preset(projection.interconnect, projection.links_per_node).network()
        predictions.attach_projection(study, net, projection.project_to, scaling=spec.scaling,
                                      overlap=projection.overlap)
