"""One run, one directory (launch/rundir.py): torch's agent writes every attempt into it, names never
collide, and a restarted workload keeps its checkpoints there."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from torch.distributed.elastic.multiprocessing.api import Std

from trainscale.launch import rundir


def test_torchs_agent_writes_every_attempt_into_the_run_directory_itself(tmp_path):
    run = tmp_path / "cnn-20261124-120000"
    specs = rundir.logs_specs(run, redirects="3", tee="3", local_ranks_filter="0")
    envs = {r: {"TORCHELASTIC_RUN_ID": "trainscale-abc", "TORCHELASTIC_RESTART_COUNT": "0"} for r in (0, 1)}
    first = specs.reify(envs)
    assert first.stdouts == {r: str(run / "attempt_0" / str(r) / "stdout.log") for r in (0, 1)}
    assert first.error_files[1] == str(run / "attempt_0" / "1" / "error.json")
    assert first.tee_stdouts == {0: str(run / "attempt_0" / "0" / "stdout.log")}  # rank 0 on the console
    envs = {r: {**env, "TORCHELASTIC_RESTART_COUNT": "1"} for r, env in envs.items()}
    assert specs.reify(envs).stderrs[0] == str(run / "attempt_1" / "0" / "stderr.log")  # the restart, beside it
    assert sorted(p.name for p in run.iterdir()) == ["attempt_0", "attempt_1"]  # no <run id>_<random> directory
    assert rundir.logs_specs(run, redirects="0", tee="0", local_ranks_filter="")._redirects == Std.NONE


def test_run_directories_are_named_after_what_ran_and_never_shared(tmp_path):
    now = datetime.datetime(2026, 11, 24, 12, 0, 0)
    assert rundir.label("trainscale.workloads", ("cnn", "--epochs", "1"), module=True) == "cnn"
    assert rundir.label("/x/train_llm.py", (), module=False) == "train_llm"
    assert rundir.label("mypkg.train", (), module=True) == "train"
    made = [rundir.create(tmp_path / "runs", "cnn", now=now) for _ in range(3)]
    assert [p.name for p in made] == ["cnn-20261124-120000", "cnn-20261124-120000-2", "cnn-20261124-120000-3"]
    assert all(p.is_dir() and not any(p.iterdir()) for p in made)


def test_a_restarted_workload_keeps_its_checkpoints_in_the_run_directory(tmp_path):
    args = ("cnn", "--epochs", "1")
    with_restarts = rundir.checkpoint_args("trainscale.workloads", args, module=True, max_restarts=2, run_dir=tmp_path)
    assert with_restarts == (*args, "--checkpoint-dir", str(tmp_path / "checkpoints"))
    # no restarts: no checkpoints unless asked; the user's own directory, and scripts, are left alone
    assert rundir.checkpoint_args("trainscale.workloads", args, module=True, max_restarts=0, run_dir=tmp_path) == args
    own = (*args, "--checkpoint-dir=ck")
    assert rundir.checkpoint_args("trainscale.workloads", own, module=True, max_restarts=2, run_dir=tmp_path) == own
    assert rundir.checkpoint_args("train.py", ("--x",), module=False, max_restarts=2, run_dir=tmp_path) == ("--x",)
    # gpt resumes from its --experiment-dir, where running the same command again looks
    gpt = ("gpt", "--experiment-dir", "exp")
    assert rundir.checkpoint_args("trainscale.workloads", gpt, module=True, max_restarts=2, run_dir=tmp_path) == gpt


def test_the_run_record_says_what_ran_and_how_it_ended(tmp_path, monkeypatch):
    logs, records = tmp_path / "logs", tmp_path / "records"  # records with a home of their own (TRAINSCALE_RUN_DIR)
    logs.mkdir()  # the records' directory is the user's: it need not exist yet
    for where in (logs, records):
        rundir.start_record(
            where,
            target="trainscale.workloads",
            args=("cnn", "--epochs", "1"),
            module=True,
            no_python=False,
            nproc_per_node=2,
            nnodes="1:1",
            max_restarts=0,
            records=records,
            logs=logs,
        )
    assert not rundir.describes_itself(records)
    rundir.end_record(logs, records, ok=True, seconds=1.5)
    for where in (logs, records):
        record = json.loads((where / "run.json").read_text())
        assert (record["workload"], record["args"], record["nproc_per_node"], record["nnodes"], record["ok"]) == (
            "cnn",
            ["--epochs", "1"],
            2,
            "1",
            True,
        )
    (records / "run.json").write_text(json.dumps({"logs": "another node's"}))  # not this launch's: left alone
    rundir.end_record(logs, records, ok=False, seconds=2.0)
    assert "ok" not in json.loads((records / "run.json").read_text())
    assert set(record["versions"]) == {"trainscale", "torch", "python"} and record["host"]
    monkeypatch.chdir(tmp_path)  # the console names a run directory as the user would type it
    assert rundir.shown(tmp_path / "trainscale-runs" / "cnn-1") == "trainscale-runs/cnn-1"
    assert rundir.shown(tmp_path.parent / "logs" / "r") == "../logs/r"  # seed 003's --log-dir ../logs
    assert rundir.shown(Path("/elsewhere/run")) == "/elsewhere/run"


def test_the_newest_run_is_latest_and_a_users_own_latest_is_left_alone(tmp_path):
    from trainscale.launch.rundir import create

    first = create(tmp_path, "cnn")
    assert (tmp_path / "latest").resolve() == first.resolve()
    second = create(tmp_path, "cnn")
    assert second != first and (tmp_path / "latest").resolve() == second.resolve()
    assert (tmp_path / "latest").is_symlink() and not list(tmp_path.glob(".latest.*"))
    mine = tmp_path / "elsewhere"
    mine.mkdir()
    (mine / "latest").write_text("the user's own\n")
    create(mine, "cnn")
    assert (mine / "latest").read_text() == "the user's own\n"


def test_last_is_the_newest_job_submitted_with_trainscale(tmp_path, monkeypatch):
    import pytest

    from trainscale.errors import SlurmError
    from trainscale.launch.slurm.jobdir import STATE_VAR, JobRecord, load_record, save_record

    monkeypatch.setenv(STATE_VAR, str(tmp_path))
    with pytest.raises(SlurmError, match="no job submitted with trainscale"):
        load_record("last")
    common = dict(
        cluster="",
        name="j",
        launcher="srun",
        profile="local-test",
        script="s",
        output_dir=str(tmp_path),
        world_size=2,
        ranks_per_node=1,
        command="c",
    )
    save_record(JobRecord(job_id="9", submitted_at=100.0, **common))
    save_record(JobRecord(job_id="10", submitted_at=200.0, **common))
    assert load_record("last").job_id == "10"
