"""``trainscale plan``'s text: the plan (plan/model.py) as the tables and lines the CLI prints, and the
predicted-against-measured table ``--verify`` and the plan-accuracy benchmark share.
"""

from __future__ import annotations

from trainscale.plan.comm import Sweep
from trainscale.plan.model import ANY_BATCH, MARGIN, Plan


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def render(plan: Plan, submit: str | None) -> list[str]:
    cal = plan.calibration
    low, high = cal.spread()
    ran = cal.recorded or len(cal.steps) + 1
    lines = [
        f"plan for {plan.what}: calibrated on 1 rank here ({cal.device}, {ran} steps, batch "
        f"{cal.batch}, {'/'.join(cal.dtypes) or '?'}): parameters {_size(cal.params)}, gradients "
        f"{_size(cal.grads)}, optimizer state {_size(cal.optimizer)}, activations {_size(cal.activations)} "
        f"per {cal.batch} samples",
        "",
    ]
    room = (
        f"{_size(plan.device_bytes)} per rank ({plan.device_source}); fits: yes within it less {MARGIN:.0%}, "
        f"tight within it only"
        if plan.device_bytes
        else f"not known ({plan.device_source})"
    )
    lines.append(f"Memory per rank at {plan.world} rank(s), batch {plan.batch} per rank; room: {room}")
    head = (
        "strategy",
        "params",
        "grads",
        "optimizer",
        "activations",
        "buckets",
        "peak",
        "fits",
        f"step at {plan.world} (ms)",
    )
    at_world = {m.strategy: plan.predict(plan.world, plan.nodes, m.strategy) for m in plan.memory}
    rows = [
        (
            m.strategy,
            _size(m.params),
            _size(m.grads),
            _size(m.optimizer),
            _size(m.activations),
            _size(m.buffers) if m.buffers else "-",
            _size(m.peak),
            plan.verdict(m),
            _step(at_world[m.strategy]),
        )
        for m in plan.memory
    ]
    lines += _table(head, rows)
    lines += [
        f"too uncertain with {s} at {plan.world} rank(s): {t['uncertain']}"
        for s, t in at_world.items()
        if t["uncertain"]
    ]
    if cal.peak and plan.same_memory:
        source = "CUDA allocated" if cal.device.startswith("cuda") else "process RSS"
        lines.append(
            f"peak: the above, the sharded strategies' gathered parameters and {_size(cal.overhead)} the "
            f"calibration's peak ({_size(cal.peak)}, {source}) held beyond them (the runtime, the step's "
            "temporaries)"
        )
    elif not plan.same_memory:
        lines.append(
            "peak: the above and the sharded strategies' gathered parameters (the calibration's memory was "
            "this CPU's, not the GPU's: the step's temporaries are kept free by the margin)"
        )
    threads = f", each rank on {cal.threads} thread(s)" if cal.device == "cpu" else ""
    over = f"over {plan.network_source} (bus bandwidth {plan.network.busbw_Bps / 1e9:.1f} GB/s)"
    if plan.sweeps:
        counts = ", ".join(map(str, sorted({w.ranks for w in plan.sweeps})))
        timed = "; ".join(dict.fromkeys(Sweep.HOOKS[w.hook] for w in plan.sweeps))
        over = f"the collectives at {counts} rank(s) as measured here ({timed}), the rest {over}"
    own = f"; {', '.join(plan.own)}'s pace its own calibration's" if plan.own else ""
    band = (
        f"no band: the calibration's steps ranged {low:.2f}x-{high:.2f}x of its median (10th-90th percentile), "
        f"too noisy to predict a range from; give more --steps than {ran} or calibrate on a quieter machine"
        if cal.noisy
        else f"band: the calibration's 10th-90th percentile step ({low:.2f}x-{high:.2f}x of its median)"
    )
    lines += [
        "",
        f"Step time and speedup with {plan.recommended or 'ddp'}, batch {plan.batch} per rank{threads}, "
        f"{over}{own}; {band}",
    ]
    rows = [
        (
            str(t["ranks"]),
            str(t["nodes"]),
            _step(t),
            "-"
            if t.get("uncertain")
            else "too noisy"
            if cal.noisy
            else f"{t['band_s'][0] * 1e3:.1f}-{t['band_s'][1] * 1e3:.1f}",
            "-" if t.get("uncertain") else f"{t['speedup']:.2f}x",
            "-" if t.get("uncertain") else f"{t['efficiency']:.0%}",
        )
        for t in plan.times
    ]
    lines += _table(("ranks", "nodes", "step (ms)", "band (ms)", "speedup", "efficiency"), rows)
    lines += [f"too uncertain at {t['ranks']} rank(s): {t['uncertain']}" for t in plan.times if t.get("uncertain")]
    if plan.target_gpus and not cal.device.startswith("cuda"):
        lines.append(
            f"These step times are this machine's {cal.device}'s: on the profile's GPUs the compute is "
            "faster and communication's share larger. Run plan on one of its GPUs for their times; the "
            "memory above holds either way."
        )
    lines.append("")
    if plan.recommended:
        why = (
            "it fits"
            if plan.fits(next(m for m in plan.memory if m.strategy == plan.recommended))
            else "the room per rank is not known"
        )
        lines.append(
            f"Recommended: --strategy {plan.recommended} ({why}; more sharding saves memory this run does "
            f"not need and adds communication)"
        )
    else:
        lines.append(
            "Recommended: nothing fits: a smaller per-rank batch (activations), more ranks (the sharded "
            "strategies divide the state), or a device with more memory"
        )
    best = plan.recommended_batch()
    if best and best.get("any"):
        lines.append(
            f"Per-rank batch: any batch up to your dataset fits under {best['strategy']} (the memory allows "
            f"more than {ANY_BATCH} samples per rank); planned {plan.batch}. Keep the global batch your "
            "optimizer's settings were tuned for, or retune the LR"
        )
    elif best and best["largest"]:
        lines.append(
            f"Per-rank batch: up to {best['largest']} fits under {best['strategy']} (global "
            f"{best['global']} at {plan.world} rank(s)); planned {plan.batch}. Larger batches use the GPU "
            "better; keep the global batch your optimizer's settings were tuned for, or retune the LR"
        )
    elif best:
        lines.append(
            "Per-rank batch: the model's state does not fit a rank under any strategy at this number of "
            "ranks, at any batch: more ranks for the sharded strategies, or a device with more memory"
        )
    if plan.cpus_per_rank is not None:
        workers = plan.workers()
        lines.append(
            f"Per rank: {plan.cpus_per_rank} CPU(s) (-c {plan.cpus_per_rank} in srun mode; torchrun mode takes "
            f"the node's), {workers} DataLoader worker(s): the data wait was {plan.data_share():.0%} of the "
            f"calibration's step" + (" (workers pay above 5%)" if not workers else "")
        )
    if submit:
        lines.append(f"Submit: {submit}")
    if plan.verified:
        lines += [
            "",
            f"Verified here (--verify: {plan.verified[0]['ranks']} rank(s), batch {plan.batch} per rank, "
            f"each configuration run {plan.verified[0]['steps']} steps; error = measured / predicted - 1):",
        ]
        lines += verified_table(plan.verified)
    lines += ["", "Not counted:"] + [f"  - {u}" for u in plan.unseen]
    return lines


def _step(predicted: dict) -> str:
    """A predicted step in ms, or that the plan cannot say (``uncertain``: why, printed below the table)."""
    return "too uncertain" if predicted.get("uncertain") else f"{predicted['step_s'] * 1e3:.1f}"


def verified_table(verified: list[dict]) -> list[str]:
    """Predicted against measured, a row per configuration (``--verify``, the plan-accuracy benchmark); a run other
    work disturbed carries * and says so, as a study's does."""

    def size(value: float | None) -> str:
        return "-" if value is None else _size(value)

    rows = [
        (
            v["config"] + (" *" if v.get("disturbed") else ""),
            "too uncertain"
            if v.get("uncertain")
            else f"{v['predicted_step_s'] * 1e3:.1f} ({v['band_s'][0] * 1e3:.1f}-{v['band_s'][1] * 1e3:.1f})",
            f"{v['measured_step_s'] * 1e3:.1f}",
            "-" if v.get("uncertain") else _error(v["step_error"]),
            size(v["predicted_held"]),
            size(v["measured_held"]),
            _error(v["held_error"]),
            size(v.get("predicted_peak")),
            size(v.get("measured_peak")),
            _error(v.get("peak_error")),
        )
        for v in verified
    ]
    disturbed = [f"{v['config']}: {v['disturbed']}" for v in verified if v.get("disturbed")]
    return (
        _table(
            (
                "configuration",
                "step ms predicted (band)",
                "measured",
                "error",
                "model state predicted",
                "measured",
                "error",
                "peak predicted",
                "measured",
                "error",
            ),
            rows,
        )
        + [
            "model state: memory for the parameters, gradients and optimizer state of the fullest rank (the run's own "
            "memory table; a script's: its rank 0's); peak: the fullest rank's (process RSS on CPU, CUDA "
            "allocated on a GPU); error: measured / predicted - 1 (+: the run took longer or more than predicted)"
        ]
        + (
            [f"* disturbed, its times say little about the plan: {'; '.join(disturbed)}. Run again on a quiet machine"]
            if disturbed
            else []
        )
        + [f"too uncertain, {v['config']}: {v['uncertain']}" for v in verified if v.get("uncertain")]
    )


def _error(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _table(head: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    return ["  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() for row in (head, *rows)]
