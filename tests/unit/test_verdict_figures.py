"""A verdict names a cause only when the tables show it (issue 38 item 4): a rank that waited for another's
start-up at its first collective (rank 0 starting four trackers) once read "communication takes 97% of the
step", a figure in no table. The shares leave the first step out; the start-up wait is named as what it is."""

from __future__ import annotations

from pathlib import Path

from trainscale.report.gather import Gathered, rank_stats
from trainscale.report.pages import rank_table
from trainscale.report.verdict import findings


def steps(first_comm_s: float, n: int = 30) -> list[dict]:
    records = [{"kind": "meta", "rank": 0, "node": "n1"}]
    for i in range(1, n + 1):
        comm = first_comm_s if i == 1 else 0.002
        records.append(
            {
                "kind": "step",
                "step": i,
                "step_s": 0.020 + comm,
                "data_s": 0.001,
                "compute_s": 0.008,
                "backward_s": 0.007,
                "optimizer_s": 0.002,
                "comm_s": comm,
                "samples": 16,
            }
        )
    return records


def test_a_start_up_wait_in_the_first_step_is_not_communication():
    waiting = rank_stats(1, steps(first_comm_s=9.5))  # rank 1 waited 9.5 s for rank 0's trackers at step 1
    starting = rank_stats(0, steps(first_comm_s=0.002))
    g = Gathered(source=Path("."), ranks=[starting, waiting], samples={}, events=[])
    said = findings(g)
    assert not any("communication takes" in f.message for f in said), said
    (note,) = [f for f in said if "first step" in f.message]
    assert note.level == "note" and "the first step took up to 9.5 s (rank 1)" in note.message
    # the table's comm share and the verdict's come from the same steps: 2 ms of a 22 ms step
    assert rank_table(g).rows[1][9] == "9%"


def test_communication_the_tables_show_is_named_with_their_figure():
    records = steps(first_comm_s=0.03)
    for r in records[2:]:
        r["comm_s"], r["step_s"] = 0.03, 0.048  # every step waits 30 ms for its all-reduce
    heavy = rank_stats(0, records)
    g = Gathered(source=Path("."), ranks=[heavy, rank_stats(1, records)], samples={}, events=[])
    (said,) = [f for f in findings(g) if "communication takes" in f.message]
    assert said.message.startswith(f"communication takes {rank_table(g).rows[0][9]} of the step")


def test_communication_advice_never_names_a_sharded_strategy():
    """A high exposed share of communication, under ddp or fsdp (FSDP's all-gathers in forward are communication
    too: observe/hooks.py): sharding saves memory and moves as many bytes as an all-reduce, or more, so "a
    sharded strategy" is no advice for it, to a run that has one or not."""
    from trainscale.observe.stragglers import diagnose

    records = steps(first_comm_s=0.03)
    for r in records[2:]:
        r["comm_s"], r["step_s"] = 0.03, 0.048
    said = {}
    for strategy in ("ddp", "fsdp"):
        ranks = {rank: [{**records[0], "rank": rank, "strategy": strategy}, *records[1:]] for rank in (0, 1)}
        g = Gathered(
            source=Path("."),
            ranks=[rank_stats(r, recs) for r, recs in ranks.items()],
            samples={},
            events=[],
            extra={"diagnosis": diagnose(ranks)},
        )
        (said[strategy],) = [f.message for f in findings(g) if "communication takes" in f.message]
    assert all("sharded" not in text for text in said.values()), said
    assert said["fsdp"].endswith("gradient accumulation or overlap (docs/scaling.md)"), said


def test_a_data_wait_is_the_dataloaders_only_where_its_batches_took_most_of_it():
    """Every rank evaluating for 400 ms every 10 steps (an HF Trainer's distributed evaluation) put 91% of the
    step in the data wait, and the report advised "more DataLoader workers"; the DataLoader's own time (its
    ``__next__``, ``loader_s``) says whether the wait is its."""
    evaluating = steps(first_comm_s=0.002)
    for r in evaluating[1:]:
        r["loader_s"] = 0.0005
        if r["step"] % 10 == 0:
            r["data_s"] += 0.4
            r["step_s"] += 0.4
    g = Gathered(source=Path("."), ranks=[rank_stats(0, evaluating), rank_stats(1, evaluating)], samples={}, events=[])
    (said,) = [f for f in findings(g) if "before each forward" in f.message or "waiting for data" in f.message]
    assert said.message.startswith("host work before each forward takes ") and "DataLoader workers" not in said.message
    assert said.message.endswith("not the DataLoader, whose batches took 1%"), said.message
    feeding = steps(first_comm_s=0.002)
    for r in feeding[1:]:
        r["data_s"] += 0.02
        r["step_s"] += 0.02
        r["loader_s"] = 0.0205  # the DataLoader's batches hold the wait
    g = Gathered(source=Path("."), ranks=[rank_stats(0, feeding), rank_stats(1, feeding)], samples={}, events=[])
    (said,) = [f for f in findings(g) if "waiting for data" in f.message]
    assert "takes 50% of the step, the DataLoader's batches 49%: more DataLoader workers" in said.message, said.message
    bare = steps(first_comm_s=0.002)
    for r in bare[1:]:
        r["data_s"] += 0.02
        r["step_s"] += 0.02
    g = Gathered(source=Path("."), ranks=[rank_stats(0, bare), rank_stats(1, bare)], samples={}, events=[])
    assert any(f.message.endswith("no DataLoader was seen") for f in findings(g))
