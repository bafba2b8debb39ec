"""Put the projection model next to a study's measurements.

- ``validate``: predict every measured multi-rank run from the single-rank run and the all-reduce
  bus bandwidth measured at that rank count on this machine; the error says how far to trust it.
- ``attach_projection``: predicted rows at 8 ... N ranks for a preset (or the measured) network.
"""

from __future__ import annotations

from pathlib import Path

from trainscale.bench.projection import (Measured, ModelOptions, Network, predict, project, projection_ranks)
from trainscale.errors import ConfigError


def source_run(runs: list[dict], baseline: str) -> dict:
    """The single-rank run the model starts from (the baseline when it has one rank)."""
    singles = [r for r in runs if r.get("status") == "ok" and r["world_size"] == 1 and r.get("breakdown")]
    if not singles:
        raise ConfigError("a projection starts from a measured single-rank run, and this study has none",
                          hint="add 1 (or cpu) to --configs")
    return next((r for r in singles if r["config"] == baseline), singles[0])


def measured_from_run(run: dict) -> Measured:
    b = run["breakdown"]
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


def validate(study: dict, measure, shared_compute: bool) -> list[dict]:
    """Predict each measured multi-rank single-node run; ``measure(n, sizes) -> allreduce result``."""
    runs = study["runs"]
    source = source_run(runs, study["baseline"])
    measured = measured_from_run(source)
    rows = []
    for run in runs:
        if run.get("status") != "ok" or run["world_size"] < 2 or run["nodes"] != 1 or not run.get("steps"):
            continue
        result = measure(run["world_size"], allreduce_sizes(measured.gradient_bytes))
        if not result or "rows" not in result:
            continue
        network = network_from_allreduce(result, measured.gradient_bytes)
        scaling = "strong" if run["per_rank_batch"] * run["world_size"] == source["per_rank_batch"] else "weak"
        options = ModelOptions(scaling=scaling, shared_compute=shared_compute,
                               buckets=(run.get("breakdown") or {}).get("buckets") or None)
        pred = predict(measured, network, run["world_size"], options)
        run["predicted_runtime_s"] = pred.step_s * run["steps"]
        run["prediction"] = {**pred.as_dict(), "network": network.__dict__, "scaling": scaling,
                             "error": run["predicted_runtime_s"] / run["runtime_s"] - 1}
        rows.append(run)
    return rows


def attach_projection(study: dict, network: Network, project_to: int, *, scaling: str, overlap: float = 1.0) -> dict:
    runs = study["runs"]
    source = source_run(runs, study["baseline"])
    base = next(r for r in runs if r["config"] == study["baseline"])
    if base.get("status") != "ok" or not base.get("samples"):
        raise ConfigError(f"the baseline {study['baseline']!r} has no measured throughput to compare with",
                          hint="choose a baseline that completed with metrics")
    measured = measured_from_run(source)
    largest = max(r["world_size"] for r in runs)
    start = 8 if largest < 8 else 2 ** largest.bit_length()
    preds = project(measured, network, projection_ranks(min(start, project_to), project_to),
                    ModelOptions(scaling=scaling, overlap=overlap))
    base_rate = base["samples"] / base["runtime_s"]
    rows = []
    for p in preds:
        speedup = p.samples_per_s / base_rate
        rows.append({**p.as_dict(), "label": f"{p.ranks} ranks", "speedup": speedup,
                     "efficiency": speedup / (p.ranks / base["world_size"]),
                     "runtime_s": base["samples"] / p.samples_per_s})
    study["projection"] = {"from": source["config"], "network": network.__dict__, "scaling": scaling,
                           "overlap": overlap, "gradient_bytes": measured.gradient_bytes, "measured": measured.__dict__,
                           "rows": rows, "dropped_above": network.max_ranks}
    return study["projection"]


def allreduce_measurer(out_dir: Path, device: str = "auto"):
    """A ``measure(n, sizes)`` that launches the all-reduce benchmark like training."""
    from trainscale.bench.runner import measure_allreduce

    def measure(n: int, sizes: str) -> dict | None:
        return measure_allreduce(n, sizes, out_dir / f"allreduce-{n}.json", out_dir / "runs" / f"allreduce-{n}",
                                 iters=30, budget_s=2.0, device=device)

    return measure
