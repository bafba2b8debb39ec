"""Put the projection model next to a study's measurements: ``validate`` predicts each measured multi-rank
run's steady step from the single-rank run and the all-reduce measured at its rank count, calibrated on the
*other* runs (leave one out); ``attach_projection`` adds predicted rows for a preset (or the measured)
network. The method: docs/scaling.md, "Validation and calibration on this machine"."""

from __future__ import annotations

from statistics import geometric_mean

from trainscale.bench.projection import (HOST_SECTIONS, Calibration, Measured, ModelOptions, Network, Prediction,
                                         hideable_s, predict, project, projection_ranks)
from trainscale.errors import ConfigError


def source_run(runs: list[dict], baseline: str) -> dict:
    """The single-rank run the model starts from (the baseline when it has one rank)."""
    singles = [r for r in runs if r.get("status") == "ok" and r["world_size"] == 1 and r.get("breakdown")]
    if not singles:
        raise ConfigError("a projection starts from a measured single-rank run, and this study has none",
                          hint="add 1 (or cpu) to --configs")
    return next((r for r in singles if r["config"] == baseline), singles[0])


def breakdown(run: dict) -> dict:
    """The per-step sections the model is built from and checked against: the run's steady state (after
    its first epoch, results.steady_state), else all of it."""
    return (run.get("steady") or {}).get("breakdown") or run["breakdown"]


def step_time(run: dict) -> float:
    """The run's measured seconds per step in its steady state, else over all of it."""
    steady = run.get("steady") or {}
    return steady.get("step_time_s") or run["runtime_s"] / run["steps"]


def disturbed(run: dict) -> bool:
    """Other work shared the run's cores (bench/runner.other_load): its times say little about the model."""
    from trainscale.observe.sampler import OTHER_WORK_SHARE

    return (run.get("other_cpu_share") or 0.0) >= OTHER_WORK_SHARE


def measured_from_run(run: dict) -> Measured:
    b = breakdown(run)
    return Measured(data_s=b["data"], compute_s=b["compute"], optimizer_s=b["optimizer"],
                    other_s=b["other"] + b.get("communication", 0.0), batch=run["per_rank_batch"],
                    gradient_bytes=b["gradient_bytes"])


def network_from_allreduce(result: dict, gradient_bytes: int) -> Network:
    """busbw at the gradient's size; latency per ring step from the smallest message."""
    from trainscale.bench.allreduce import nearest_row

    n = result["world_size"]
    row = nearest_row(result, gradient_bytes)
    small = min(result["rows"], key=lambda r: r["bytes"])
    steps = 2 * (n - 1)
    latency = max(0.0, small["time_s"] - steps / n * small["bytes"] / row["busbw_Bps"]) / steps
    return Network(name=f"measured ({n} ranks)", busbw_Bps=row["busbw_Bps"], latency_s=latency)


def allreduce_sizes(gradient_bytes: int) -> str:
    """A tiny message (latency) and the gradient's size, rounded to whole float32 elements."""
    size = max(4096, gradient_bytes - gradient_bytes % 4)
    return f"4KB,{size}B"


def contention(run: dict, source: dict) -> float:
    """ranks x the source rank's compute units / the run's (bench/ideal.py); 1 where they cannot be compared."""
    units, base = run.get("compute_units"), source.get("compute_units")
    if not units or not base or run.get("compute_kind") != source.get("compute_kind"):
        return 1.0
    return run["world_size"] * base / units


def measured_overlap(run: dict, options: ModelOptions) -> float | None:
    """The share of the hideable backward time the run hid all-reduces behind (None: nothing was hideable)."""
    b = breakdown(run) if run.get("breakdown") else {}
    window = hideable_s(b.get("compute", 0.0), int(b.get("gradient_bytes", 0)), options)
    if window <= 0 or not b.get("communication_total"):
        return None
    return min(1.0, max(0.0, b["communication_total"] - b.get("communication", 0.0)) / window)


def fit_calibration(points: list[tuple[dict, ModelOptions, Prediction]]) -> Calibration | None:
    """Per-section and communication factors (geometric means of measured / modelled) and the mean
    measured overlap, from multi-rank runs and their uncalibrated predictions. Only runs with a core per
    thread teach the communication factor: where ranks take turns on cores, the all-reduce also holds the
    wait for core-mates, which the model counts as compute (measured_section; docs/scaling.md)."""
    if not points:
        return None
    comm = [breakdown(run)["communication_total"] / pred.comm_s for run, options, pred in points
            if breakdown(run).get("communication_total", 0.0) > 0 and pred.comm_s > 0
            and options.ranks_per_core <= 1]
    comm_factor = geometric_mean(comm) if comm else 1.0
    sections = {}
    for name in HOST_SECTIONS:
        ratios = [measured_section(run, options, pred, name, comm_factor) / getattr(pred, f"{name}_s")
                  for run, options, pred in points
                  if breakdown(run).get(name, 0.0) > 0 and getattr(pred, f"{name}_s") > 0]
        if ratios:
            sections[name] = geometric_mean(ratios)
    overlaps = [o for o in (measured_overlap(run, options) for run, options, _ in points) if o is not None]
    return Calibration(sections=sections, comm=comm_factor,
                       overlap=sum(overlaps) / len(overlaps) if overlaps else None,
                       runs=tuple(run["config"] for run, _, _ in points))


def measured_section(run: dict, options: ModelOptions, plain: Prediction, name: str, comm_factor: float = 1.0) -> float:
    """A run's measured seconds of a host section as the model counts them: compute of ranks that take
    turns on cores includes the wait for core-mates, which the timer recorded in the all-reduce."""
    b = breakdown(run)
    if name != "compute" or options.ranks_per_core <= 1:
        return b[name]
    return b["compute"] + max(0.0, b.get("communication_total", 0.0) - plain.comm_s * comm_factor)


def validate(study: dict, measure) -> list[dict]:
    """Predict each measured multi-rank single-node run; ``measure(n, sizes) -> allreduce result``.

    Every prediction is made twice: with the plain model, and calibrated on the other multi-rank runs
    (a run alone has nothing else to calibrate on, and keeps the plain prediction). A run that other work
    on its cores disturbed (:func:`disturbed`) is predicted too, and calibrates nothing. The study gets
    the calibration fitted on all the others (``study["calibration"]``) for the projection."""
    runs = study["runs"]
    source = source_run(runs, study["baseline"])
    measured = measured_from_run(source)
    points = []
    for run in runs:
        if (run.get("status") != "ok" or run["world_size"] < 2 or run["nodes"] != 1 or not run.get("steps")
                or not run.get("breakdown")):
            continue
        result = measure(run["world_size"], allreduce_sizes(measured.gradient_bytes))
        if not result or "rows" not in result:
            continue
        network = network_from_allreduce(result, measured.gradient_bytes)
        scaling = "strong" if run["per_rank_batch"] * run["world_size"] == source["per_rank_batch"] else "weak"
        options = ModelOptions(scaling=scaling, contention=contention(run, source),
                               ranks_per_core=run.get("ranks_per_core") or 1.0,
                               buckets=breakdown(run).get("buckets") or None)
        points.append((run, network, options, predict(measured, network, run["world_size"], options)))
    for run, network, options, plain in points:  # a disturbed run calibrates nothing
        calibration = fit_calibration([(r, o, p) for r, _, o, p in points if r is not run and not disturbed(r)])
        pred = predict(measured, network, run["world_size"], options, calibration) if calibration else plain
        measured_step = step_time(run)
        run["predicted_step_s"] = pred.step_s
        run["prediction"] = {**pred.as_dict(), "network": network.__dict__, "scaling": options.scaling,
                             "contention": options.contention, "measured_step_s": measured_step,
                             "from_epoch": (run.get("steady") or {}).get("from_epoch", 1),
                             "error": pred.step_s / measured_step - 1,
                             "uncalibrated_error": plain.step_s / measured_step - 1,
                             "calibrated_on": list(calibration.runs) if calibration else [],
                             "disturbed": disturbed(run)}
    everything = fit_calibration([(r, o, p) for r, _, o, p in points if not disturbed(r)])
    if everything:
        study["calibration"] = {"sections": everything.sections, "comm": everything.comm,
                                "overlap": everything.overlap, "runs": list(everything.runs)}
    return [p[0] for p in points]


def attach_projection(study: dict, network: Network, project_to: int, *, scaling: str, overlap: float = 1.0) -> dict:
    """Predicted rows for ``network``. Of a validation's calibration only the measured overlap carries over
    (it is the training's own); its section and communication factors describe this machine's cores and
    network, not the projected ones."""
    runs = study["runs"]
    source = source_run(runs, study["baseline"])
    base = next(r for r in runs if r["config"] == study["baseline"])
    if base.get("status") != "ok" or not base.get("samples"):
        raise ConfigError(f"the baseline {study['baseline']!r} has no measured throughput to compare with",
                          hint="choose a baseline that completed with metrics")
    measured = measured_from_run(source)
    largest = max(r["world_size"] for r in runs)
    start = 8 if largest < 8 else 2 ** largest.bit_length()
    measured_overlap_ = (study.get("calibration") or {}).get("overlap")
    calibration = Calibration(sections={}, overlap=measured_overlap_) if measured_overlap_ is not None else None
    preds = project(measured, network, projection_ranks(min(start, project_to), project_to),
                    ModelOptions(scaling=scaling, overlap=overlap), calibration)
    # the steady state's rate, as the model predicts
    base_rate = (base.get("steady") or {}).get("samples_per_s") or base["samples"] / base["runtime_s"]
    rows = []
    for p in preds:
        speedup = p.samples_per_s / base_rate
        rows.append({**p.as_dict(), "label": f"{p.ranks} ranks", "speedup": speedup,
                     "efficiency": speedup / (p.ranks / base["world_size"]),
                     "runtime_s": base["samples"] / p.samples_per_s})
    study["projection"] = {"from": source["config"], "network": network.__dict__, "scaling": scaling,
                           "overlap": overlap if calibration is None else measured_overlap_,
                           "overlap_measured": calibration is not None, "gradient_bytes": measured.gradient_bytes, "measured": measured.__dict__,
                           "rows": rows, "dropped_above": network.max_ranks}
    return study["projection"]


def averaging_hook(workload_args: tuple[str, ...] | list[str]) -> str:
    """What the study's DDP runs averaged with, for the all-reduce benchmark's ``--hook``: ``shm`` or
    ``auto`` as named in ``--strategy ...:comm_hook=`` (default auto), the backend's (none) otherwise."""
    from trainscale.launch.preflight import option_value
    from trainscale.strategies import parse_spec

    hook = parse_spec(option_value(workload_args, "--strategy") or "ddp")[1].get("comm_hook", "auto").lower()
    return hook if hook in ("auto", "shm") else "none"

