"""`trainscale report`'s pages from files as their makers write them (no launches; sacct faked at its
subprocess boundary): a SLURM job's page, a study's page that marks what cannot be a result."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from trainscale.launch.slurm.jobdir import JobRecord, save_record
from trainscale.report import build, render_html, render_text


def _records(run: Path, world: int = 2) -> None:
    metrics = run / "metrics"
    metrics.mkdir(parents=True)
    for rank in range(world):
        lines = [
            {
                "kind": "meta",
                "rank": rank,
                "host": "n1",
                "node": "n1",
                "t": 1795500000.0,
                "world_size": world,
                "device": "cpu",
                "backend": "gloo",
                "workload": "cnn",
                "strategy": "ddp",
            }
        ]
        lines += [
            {
                "kind": "step",
                "step": i,
                "step_s": 0.1,
                "data_s": 0.01,
                "compute_s": 0.03,
                "backward_s": 0.04,
                "optimizer_s": 0.01,
                "samples": 16,
            }
            for i in range(1, 21)
        ]
        (metrics / f"rank-{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))


def test_a_job_id_gives_its_run_page_with_what_ran_and_slurms_accounting(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINSCALE_STATE_DIR", str(tmp_path / "state"))
    run = tmp_path / "trainscale-jobs" / "cnn-20261124-120000"
    _records(run)
    (run / "submission.json").write_text(
        json.dumps(
            {
                "command": [
                    "trainscale",
                    "slurm",
                    "--profile",
                    "local-test",
                    "-N",
                    "2",
                    "--submit",
                    "--workload",
                    "cnn",
                ],
                "submitted_at": "2026-11-24T12:00:00+0000",
                "host": "login1",
                "profile": "local-test",
                "spec": {"workload": "cnn", "args": ["--epochs", "1"]},
                "plan": {"launcher": "torchrun", "nodes": 2, "ranks_per_node": 1, "world_size": 2},
                "versions": {"trainscale": "0.1.0", "torch": "2.13.0", "python": "3.11.7"},
            }
        )
    )
    save_record(
        JobRecord(
            job_id="4711",
            name="cnn",
            launcher="torchrun",
            profile="local-test",
            script=str(run / "job.sbatch"),
            output_dir=str(tmp_path),
            world_size=2,
            ranks_per_node=1,
            run_dir=str(run),
        )
    )

    def sacct(argv, **_):
        assert argv[:3] == ["sacct", "-j", "4711"]
        return subprocess.CompletedProcess(argv, 0, "4711|cnn|COMPLETED|0:0|00:10:00|n[1-2]|0|8|00:40:00||2\n", "")

    page = build("4711", tmp_path / "out", sacct_run=sacct)
    facts = dict(page.facts)
    assert facts["what ran"] == "workload cnn --epochs 1"
    assert facts["ranks"] == "2 rank(s) on 2 node(s), torchrun launch mode, cpu (gloo)"
    assert facts["strategy"] == "ddp" and facts["date"] == "2026-11-24T12:00:00+0000"
    assert facts["versions"] == "trainscale 0.1.0, torch 2.13.0, python 3.11.7"
    assert facts["SLURM"] == "job 4711, profile local-test, submitted from login1"
    titles = [s.title for s in page.sections]
    assert titles[:2] == ["Ranks", "SLURM accounting"]
    accounting = page.sections[1].tables[0].rows
    assert ["State", "COMPLETED"] in accounting and ["CPU efficiency", "50%"] in accounting
    text = render_text(page)
    assert "SLURM      job 4711" in text and "[good] no problem found" in text
    html = render_html(page)
    assert "<th>what ran</th><td>workload cnn --epochs 1</td>" in html


def test_a_studys_page_never_shows_an_impossible_speedup_and_gives_each_configurations_verdict(tmp_path):
    """A study as bench wrote it before it marked anything: the report marks it."""
    study = tmp_path / "study"
    _records(study / "runs" / "02-2")
    runs = [
        {
            "name": "01-1",
            "config": "1",
            "label": "Single CPU rank",
            "world_size": 1,
            "nodes": 1,
            "nproc_per_node": 1,
            "device": "cpu",
            "status": "ok",
            "runtime_s": 116.6,
            "samples": 2876,
            "samples_per_s": 24.7,
            "speedup": 1.0,
            "efficiency": 1.0,
            "achievable_speedup": 1.0,
            "efficiency_vs_achievable": 1.0,
            "other_cpu_share": 0.83,
            "compute_kind": "cpu",
        },
        {
            "name": "02-2",
            "config": "2",
            "label": "DDP 2 CPU ranks",
            "world_size": 2,
            "nodes": 1,
            "nproc_per_node": 2,
            "device": "cpu",
            "status": "ok",
            "runtime_s": 14.9,
            "samples": 2876,
            "samples_per_s": 193.0,
            "speedup": 7.76,
            "efficiency": 3.88,
            "achievable_speedup": 1.0,
            "efficiency_vs_achievable": 7.76,
            "other_cpu_share": 0.81,
            "compute_kind": "cpu",
            "strategy": "ddp",
        },
    ]
    (study / "results.json").write_text(
        json.dumps(
            {
                "target": "workload cnn",
                "baseline": "1",
                "runs": runs,
                "spec": {"scaling": "weak", "epochs": 2, "batch_size": 16},
                "environment": {
                    "host": "vm",
                    "cores": 2,
                    "device": "CPU",
                    "torch": "2.13.0",
                    "trainscale": "0.1.0",
                    "python": "3.11.7",
                },
                "started_at": "2026-11-24T12:00:00+00:00",
                "command": ["trainscale", "bench", "--workload", "cnn", "--configs", "1,2"],
            }
        )
    )
    page = build(str(study), None)
    text = render_text(page)
    assert "7.76x" not in text.split("== Scaling study ==")[1].split("\n—(disturbed)")[0]  # not in the table
    assert "776%" not in text and "388%" not in text
    table = page.sections[0].tables[0]
    assert table.rows[1][3:5] == ["—(disturbed)", "—(disturbed)"] and table.rows[0][2] == "116.6*"
    assert (
        page.verdict[0].level == "problem"
        and "DDP 2 CPU ranks: no speedup shown: 7.76x measured, above the "
        "1.00x its hardware allows (+20% for cache effects"
        in page.verdict[0].message
    )
    assert [s.title for s in page.sections[1:]] == ["Single CPU rank (01-1)", "DDP 2 CPU ranks (02-2)"]
    assert page.sections[1].verdict[0].message == "no records of this configuration"
    assert page.sections[2].tables[0].rows[0][:3] == ["0", "n1", "20"]  # its ranks, from its own records
    facts = dict(page.facts)
    assert facts["what ran"] == (
        "scaling study of workload cnn: a fixed problem: 2 epoch(s) at each size, per-rank "
        "batch 16 (the global batch grows with the ranks), baseline 1"
    )
    assert facts["command"] == "trainscale bench --workload cnn --configs 1,2"


@pytest.mark.parametrize("target", ["nowhere", "12x"])
def test_a_wrong_target_is_refused_naming_what_the_report_takes(tmp_path, target, capsys):
    from trainscale.cli.main import main

    assert main(["report", str(tmp_path / target) if target == "nowhere" else target]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith("trainscale: error: ")
    assert "is neither a directory nor a SLURM job id" in err[0]
    assert (
        err[1].startswith("Hint: trainscale report takes a run directory")
        and "study directory" in err[1]
        and "sweep" in err[1]
        and "job" in err[1]
    )


def test_reading_a_run_does_not_import_torch(tmp_path):
    """`trainscale report` on a run reads files: it must not pay torch's import (1.5-3 s a call) through the
    bench package or a strategy's advice, which only a study's report asks for."""
    import sys

    run = tmp_path / "trainscale-runs" / "cnn-20261124-120000"
    _records(run)
    (run / "run.json").write_text(json.dumps({"command": ["trainscale", "run", "--workload", "cnn"]}))
    probe = (
        "import sys\nfrom trainscale.cli.main import main\n"
        f"code = main(['report', {str(run)!r}, '--text'])\n"
        "print('exit', code, 'torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.stdout.splitlines()[-1] == "exit 0 False", done.stdout[-2000:] + done.stderr[-2000:]
