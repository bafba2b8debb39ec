"""Submission (faked sbatch), job records, logs, triage of failed jobs, the port module and bootstrap's srun helpers."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from trainscale.errors import LaunchError, SlurmError
from trainscale.launch.slurm import JobRecord, load_record, rank_log_text, save_record, submit, write_script
from trainscale.launch.slurm.queue import JobInfo
from trainscale.launch.slurm.submit import cancel, parse_parsable
from trainscale.launch.slurm.triage import find_failure, srun_task_errors, trim_traceback
from trainscale.launch.slurm.watch import explain


@pytest.fixture
def state(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINSCALE_STATE_DIR", str(tmp_path / "state"))
    return tmp_path / "state"


def record(tmp_path: Path, launcher: str = "srun", job_id: str = "42") -> JobRecord:
    return JobRecord(
        job_id=job_id,
        name="exp",
        launcher=launcher,
        profile="local-test",
        script="s.sbatch",
        output_dir=str(tmp_path / "jobs"),
        world_size=4,
        ranks_per_node=2,
    )


def test_write_script_never_overwrites(tmp_path):
    path = write_script("#!/bin/bash\n", tmp_path / "out" / "a.sbatch")
    assert path.read_text() == "#!/bin/bash\n"
    with pytest.raises(SlurmError, match="already exists; trainscale does not overwrite"):
        write_script("other", path)
    assert path.read_text() == "#!/bin/bash\n"


@pytest.mark.parametrize("out, parsed", [("123\n", ("123", "")), ("77;lumi\n", ("77", "lumi"))])
def test_parse_parsable(out, parsed):
    assert parse_parsable(out) == parsed


def test_submit_calls_sbatch_parsable(tmp_path):
    calls = []

    def fake(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, "4711;cluster1\n", "")

    sub = submit(tmp_path / "job.sbatch", run=fake)
    assert calls == [["sbatch", "--parsable", str(tmp_path / "job.sbatch")]]
    assert (sub.job_id, sub.cluster) == ("4711", "cluster1")


def test_submit_refused_by_slurm(tmp_path):
    def fake(argv, **kwargs):
        return subprocess.CompletedProcess(argv, 1, "", "sbatch: error: invalid partition specified: gpux\n")

    with pytest.raises(SlurmError, match="invalid partition specified: gpux"):
        submit(tmp_path / "job.sbatch", run=fake)
    with pytest.raises(SlurmError, match="cannot read a job id"):
        submit(
            tmp_path / "job.sbatch", run=lambda a, **k: subprocess.CompletedProcess(a, 0, "Submitted batch job\n", "")
        )


def test_cancel_and_signal():
    calls = []
    cancel("12", run=lambda a, **k: calls.append(a) or subprocess.CompletedProcess(a, 0, "", ""))
    cancel("12", signal="USR1", run=lambda a, **k: calls.append(a) or subprocess.CompletedProcess(a, 0, "", ""))
    assert calls == [["scancel", "12"], ["scancel", "--signal=USR1", "12"]]
    with pytest.raises(SlurmError, match="scancel 12 failed: Invalid job id"):
        cancel("12", run=lambda a, **k: subprocess.CompletedProcess(a, 1, "", "Invalid job id specified"))


def test_record_round_trip(tmp_path, state):
    rec = record(tmp_path)
    path = save_record(rec)
    assert path == state / "jobs" / "42.json"
    assert load_record("42") == rec
    with pytest.raises(SlurmError, match="no record of job 43"):
        load_record("43")
    with pytest.raises(SlurmError, match="not a SLURM job id"):
        load_record("../etc/passwd")


def test_rank_logs_srun_mode(tmp_path):
    rec = record(tmp_path, "srun")
    rec.job_dir.mkdir(parents=True)
    (rec.job_dir / "rank-3.out").write_text("hello from 3\n")
    assert rank_log_text(rec, 3) == "hello from 3\n"
    with pytest.raises(SlurmError, match="rank 4 is outside 0..3"):
        rank_log_text(rec, 4)
    with pytest.raises(SlurmError, match="no log for rank 1"):
        rank_log_text(rec, 1)


def test_rank_logs_torchrun_mode_from_prefixed_node_logs(tmp_path):
    rec = record(tmp_path, "torchrun")
    rec.job_dir.mkdir(parents=True)
    (rec.job_dir / "node-0.out").write_text("[rank0]: a\n[rank1]: b\ntrainscale: agent line\n")
    (rec.job_dir / "node-1.out").write_text("[rank3]: c\n[rank2]: d\n[rank3]: e\n")
    assert rank_log_text(rec, 3) == "c\ne\n"
    assert rank_log_text(rec, 0) == "a\n"


def test_a_rank_that_printed_nothing_has_empty_output_once_the_nodes_logged(tmp_path):
    """job.logs(rank=R) and `trainscale jobs J --rank R` give the same answer: empty for a rank that printed
    nothing (issue 38: the Python API said "may not have started yet" of a COMPLETED job's silent rank)."""
    rec = record(tmp_path, "torchrun")
    rec.job_dir.mkdir(parents=True)
    with pytest.raises(SlurmError, match="no node log in"):  # no node has logged: the ranks have not started
        rank_log_text(rec, 2)
    (rec.job_dir / "node-0.out").write_text("[rank0]: a\n")
    assert rank_log_text(rec, 2) == ""


@pytest.mark.parametrize("moved", [False, True])
def test_a_rank_moved_to_another_node_by_a_later_attempt_keeps_both_attempts_lines(tmp_path, moved):
    """torch's rendezvous numbers nodes as they join: attempt 2 (a requeue, or a restart by the agent) may run
    rank 0 on the other node (CI saw its lines missing). A rank that stayed has only its node's log read."""
    rec = dataclasses.replace(record(tmp_path, "torchrun"), run_dir=str(tmp_path / "run"))
    (tmp_path / "run" / "metrics").mkdir(parents=True)
    metas = [{"kind": "meta", "node": "n1"}, {"kind": "step"}, {"kind": "meta", "node": "n2" if moved else "n1"}]
    (tmp_path / "run" / "metrics" / "rank-0.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metas))
    rec.job_dir.mkdir(parents=True)
    Path(rec.batch_output).write_text("trainscale: job 42 on n[1-2], master n1:1, restart 1, logs in x\n")
    (rec.job_dir / "node-0.out").write_text("[rank0]: attempt 1\n[rank1]: b\n" + ("" if moved else "[rank0]: 2\n"))
    (rec.job_dir / "node-1.out").write_text("[rank2]: c\n" + ("[rank0]: 2\n" if moved else "[rank0]: never read\n"))
    assert rank_log_text(rec, 0) == "attempt 1\n2\n"


def error_file(path: Path, message: str, stack: str) -> None:
    path.write_text(
        json.dumps({"message": {"message": message, "extraInfo": {"py_callstack": stack, "timestamp": "1700000000"}}})
    )


USER_TB = (
    "Traceback (most recent call last):\n"
    '  File "/venv/torch/distributed/elastic/multiprocessing/errors/__init__.py", line 367, in wrapper\n'
    "    return f(*args, **kwargs)\n"
    '  File "/src/trainscale/launch/bootstrap.py", line 81, in _main\n'
    '    runpy.run_path(target, run_name="__main__")\n'
    '  File "<frozen runpy>", line 291, in run_path\n'
    '  File "/home/u/train.py", line 9, in <module>\n'
    '    raise RuntimeError("boom on 3")\n'
    "RuntimeError: boom on 3\n"
)


def test_trim_traceback_keeps_user_frames():
    trimmed = trim_traceback(USER_TB)
    assert "bootstrap.py" not in trimmed and "runpy" not in trimmed and "wrapper" not in trimmed
    assert '  File "/home/u/train.py", line 9, in <module>' in trimmed and trimmed.endswith("RuntimeError: boom on 3")


def test_srun_failure_first_by_file_time(tmp_path):
    job_dir = tmp_path / "job"
    (job_dir / "errors").mkdir(parents=True)
    error_file(job_dir / "errors" / "error-rank3.json", "RuntimeError: boom on 3", USER_TB)
    error_file(job_dir / "errors" / "error-rank0.json", "DistBackendError: peer closed", "gloo: Connection closed")
    now = time.time_ns()
    os.utime(job_dir / "errors" / "error-rank3.json", ns=(now - 5_000_000, now - 5_000_000))  # 5 ms earlier
    os.utime(job_dir / "errors" / "error-rank0.json", ns=(now, now))
    (job_dir / "rank-3.out").write_text("step 1\n")
    batch = (
        "srun: error: n1: task 0: Exited with exit code 1\n"
        "srun: error: n2: task 3: Exited with exit code 1\n"
        "srun: error: n1: task 1: Terminated\n"
    )
    failure = find_failure(job_dir, "srun", batch)
    assert (failure.rank, failure.host, failure.how) == (3, "n2", "Exited with exit code 1")
    text = failure.describe()
    assert text.startswith("First failing rank: rank 3 on n2") and "RuntimeError: boom on 3" in text
    assert "rank 0 on n1: Exited with exit code 1" in text and "rank 1 on n1: Terminated" in text


def test_srun_failure_without_error_files_uses_srun_lines(tmp_path):
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    (job_dir / "rank-2.out").write_text("Segmentation fault\n")
    failure = find_failure(job_dir, "srun", "srun: error: n2: tasks 2-3: Segmentation fault (core dumped)\n")
    assert (failure.rank, failure.host) == (2, "n2")
    assert "last lines of rank 2's log" in failure.describe() and "Segmentation fault" in failure.describe()
    assert srun_task_errors("srun: error: n2: tasks 2-3,5: Killed\n") == {r: ("n2", "Killed") for r in (2, 3, 5)}


SUMMARY = """========================================================================
trainscale: training FAILED — first failing rank: {rank} on {host} (local rank {local}, pid 99), exit code 1

Traceback of rank {rank}:
{tb}
Other ranks:
  rank {other} on {host}: killed by SIGTERM (after the first failure)
========================================================================
"""


def test_torchrun_failure_picks_the_node_with_the_earliest_error(tmp_path):
    job_dir = tmp_path / "job"
    written = time.time_ns()  # one clock reading for both files: node 1's error is 5 ms older, however slow the writes
    for node, (rank, local, other, tb, delay) in {
        "0": (0, 0, 1, "Traceback:\nDistBackendError: Connection closed by peer", 0),
        "1": (3, 1, 2, USER_TB.rstrip(), -5_000_000),
    }.items():
        (job_dir / f"node-{node}.out").parent.mkdir(parents=True, exist_ok=True)
        (job_dir / f"node-{node}.out").write_text(
            f"[rank{rank}]: hi\n" + SUMMARY.format(rank=rank, host=f"h{node}", local=local, other=other, tb=tb)
        )
        err = job_dir / "torchrun" / f"42_{node}" / "attempt_0" / str(local) / "error.json"
        err.parent.mkdir(parents=True)
        error_file(err, "x", tb)
        os.utime(err, ns=(written + delay, written + delay))
    failure = find_failure(job_dir, "torchrun")
    assert (failure.rank, failure.host) == (3, "h1")
    assert "RuntimeError: boom on 3" in failure.traceback
    assert "rank 0 on h0: exit code 1" in failure.others


def test_explain_failed_job_names_first_rank(tmp_path):
    rec = record(tmp_path, "srun")
    (rec.job_dir / "errors").mkdir(parents=True)
    error_file(rec.job_dir / "errors" / "error-rank3.json", "RuntimeError: boom on 3", USER_TB)
    rec.batch_output.write_text("srun: error: n2: task 3: Exited with exit code 1\n")
    text = explain(JobInfo(job_id="42", name="exp", state="FAILED", exit_code=1, signal=0), rec)
    assert "Job 42 (exp) FAILED" in text and "exit code 1" in text
    assert "First failing rank: rank 3 on n2" in text and "RuntimeError: boom on 3" in text
    assert str(rec.job_dir) in text


def test_port_module_prints_a_free_port_and_names_a_busy_one():
    from trainscale.launch.ports import choose

    port = choose("127.0.0.1")
    assert 0 < port < 65536
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port {taken} on 127.0.0.1"):
            choose("127.0.0.1", taken)
        done = subprocess.run(
            [sys.executable, "-m", "trainscale.launch.ports", "--host", "127.0.0.1", "--port", str(taken)],
            capture_output=True,
            text=True,
            env=dict(os.environ),
        )
        assert done.returncode == 1 and f"port {taken} on 127.0.0.1" in done.stderr and done.stdout == ""


SLURM_TASK = {
    "SLURM_PROCID": "3",
    "SLURM_LOCALID": "1",
    "SLURM_STEP_ID": "0",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS": "4",
    "SLURM_TASKS_PER_NODE": "2(x2)",
    "SLURM_JOB_NODELIST": "n[1-2]",
    "SLURM_JOB_ID": "42",
    "MASTER_PORT": "29511",
}


def test_bootstrap_points_error_file_into_job_dir():
    from trainscale.launch.bootstrap import set_error_file

    env = dict(SLURM_TASK, TRAINSCALE_ERROR_DIR="/jobs/j-42/errors")
    set_error_file(env)
    assert env["TORCHELASTIC_ERROR_FILE"] == "/jobs/j-42/errors/error-rank3.json"
    agent = dict(SLURM_TASK, TRAINSCALE_ERROR_DIR="/x", TORCHELASTIC_ERROR_FILE="/agent/error.json")
    set_error_file(agent)  # torchrun's agent already chose one
    assert agent["TORCHELASTIC_ERROR_FILE"] == "/agent/error.json"


def test_cli_submit_writes_script_record_and_prints_job_id(tmp_path, state, monkeypatch, capsys):
    from trainscale.cli import slurm as cli
    from trainscale.launch.slurm.submit import Submission

    script = tmp_path / "train.py"
    script.write_text("pass\n")
    seen = []

    def fake_submit(path, **kwargs):
        seen.append(Path(path).read_text())
        return Submission(job_id="555", cluster="", script=Path(path))

    monkeypatch.setattr("trainscale.launch.slurm.job.submit", fake_submit)
    rc = cli.run(
        type(
            "A",
            (),
            {
                "argv": [
                    "--profile",
                    "local-test",
                    "--time",
                    "5",
                    "--output-dir",
                    str(tmp_path / "jobs"),
                    "--submit",
                    str(script),
                    "--x",
                    "1",
                ]
            },
        )()
    )
    out, err = capsys.readouterr()
    assert rc == 0 and out.strip() == "555" and "submitted job 555" in err
    assert seen and seen[0].startswith("#!/bin/bash") and f"{script} --x 1" in seen[0]
    rec = load_record("555")
    assert rec.launcher == "torchrun" and rec.world_size == 1 and Path(rec.script).read_text() == seen[0]
    jobs = tmp_path / "jobs"  # made by the submission: git is told to leave it alone, as in a virtualenv
    assert (jobs / ".gitignore").read_text().splitlines()[-1] == "*"
    assert (jobs / "latest").resolve() == Path(rec.run_dir)


def test_a_refused_submission_leaves_no_run_directory_and_no_latest_link(tmp_path, state, monkeypatch):
    from trainscale.cli import slurm as cli

    script = tmp_path / "train.py"
    script.write_text("pass\n")
    refuse = lambda argv, **kwargs: subprocess.CompletedProcess(  # noqa: E731
        argv, 1, "", "sbatch: error: invalid partition specified: nosuchpart\n"
    )
    argv = ["--profile", "local-test", "--time", "5", "-p", "nosuchpart", "--submit", str(script)]
    jobs = tmp_path / "jobs"
    monkeypatch.setattr(
        "trainscale.launch.slurm.job.submit", lambda path, run=None, **kw: submit(path, run=refuse, **kw)
    )
    monkeypatch.setattr("trainscale.launch.slurm.cluster.partitions", lambda run=None: None)  # no sinfo answers
    with pytest.raises(SlurmError, match="invalid partition specified: nosuchpart"):
        cli.run(type("A", (), {"argv": ["--output-dir", str(jobs), *argv]})())
    assert not jobs.exists()  # the folder it made for this job is gone with it
    jobs.mkdir()
    (jobs / "mine.txt").write_text("the user's\n")
    with pytest.raises(SlurmError, match="invalid partition specified: nosuchpart"):
        cli.run(type("A", (), {"argv": ["--output-dir", str(jobs), *argv]})())
    assert sorted(p.name for p in jobs.iterdir()) == ["mine.txt"]  # no run directory, no latest link
    assert not (state / "jobs").exists()  # no record


def test_logs_cli_shows_batch_output_failure_and_rank(tmp_path, state, capsys):
    from trainscale.cli.main import main

    rec = record(tmp_path, "srun")
    save_record(rec)
    (rec.job_dir / "errors").mkdir(parents=True)
    error_file(rec.job_dir / "errors" / "error-rank3.json", "RuntimeError: boom on 3", USER_TB)
    (rec.job_dir / "rank-3.out").write_text("rank three says hi\n")
    rec.batch_output.write_text("trainscale: job 42 on n[1-2]\nsrun: error: n2: task 3: Exited with exit code 1\n")
    assert main(["jobs", "42"]) == 0
    out = capsys.readouterr().out
    assert "trainscale: job 42 on n[1-2]" in out and "First failing rank: rank 3 on n2" in out
    assert main(["jobs", "42", "--rank", "3"]) == 0
    assert "rank three says hi" in capsys.readouterr().out
    assert main(["jobs", "42", "--rank", "9"]) == 2
    assert "rank 9 is outside 0..3" in capsys.readouterr().err


def test_jobs_cli_lists_squeue(monkeypatch, capsys):
    from trainscale.cli.main import main
    from trainscale.launch.slurm import queue

    calls = []

    def fake(argv, **kwargs):
        calls.append(argv)
        return subprocess.CompletedProcess(
            argv,
            0,
            "7|train|PENDING|0:00|1:00:00|2|alice|Resources|\n8|eval|RUNNING|0:42|1:00:00|1|alice|None|n3\n",
            "",
        )

    monkeypatch.setattr(queue.subprocess, "run", fake)
    monkeypatch.setenv("USER", "alice")
    assert main(["jobs"]) == 0
    out = capsys.readouterr().out
    assert "--user=alice" in calls[0]
    assert any(line.startswith("7 ") and "PENDING" in line and "(Resources)" in line for line in out.splitlines())
    assert any(line.startswith("8 ") and "RUNNING" in line and line.endswith("n3") for line in out.splitlines())


def test_failure_under_the_images_own_torchrun_is_named(tmp_path):
    """A stock container's torch.distributed.run prints torch's own report, not trainscale's summary."""
    from trainscale.launch.kit import write_kit
    from trainscale.launch.slurm.triage import find_failure

    kit = write_kit(tmp_path / "jobs")
    script = tmp_path / "fails.py"
    script.write_text("import os\nif os.environ['RANK'] == '1':\n    raise ValueError('rank one is broken')\n")
    job_dir = tmp_path / "jobs" / "run" / "42"
    job_dir.mkdir(parents=True)
    with open(job_dir / "node-n1.out", "w") as log:
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "2",
                "--log-dir",
                str(job_dir / "torchrun"),
                "--tee",
                "3",
                str(kit / "boot.py"),
                "--script",
                str(script),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            timeout=120,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
    assert done.returncode != 0
    failure = find_failure(job_dir, "torchrun")
    assert failure is not None and failure.rank == 1 and failure.how == "exit code 1", failure
    assert "ValueError: rank one is broken" in failure.traceback


def test_every_submission_meets_the_partitions_real_sizes(tmp_path, monkeypatch):
    """The sinfo check is in the one submission path (trainscale slurm, sweep, bench --slurm, trainscale.slurm):
    a job larger than the partition here is refused before anything is written or sbatch is run."""
    from trainscale.errors import ConfigError
    from trainscale.launch.slurm import SlurmJobSpec, cluster, resolve
    from trainscale.launch.slurm.job import submit_job
    from trainscale.profiles import load_profile

    monkeypatch.setattr(cluster, "partitions", lambda run=None: cluster.parse("debug*|2|4|8000\n"))
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    profile = load_profile("local-test")
    spec = SlurmJobSpec(script=str(script), profile="local-test", nodes=3, time="5", output_dir=str(tmp_path / "jobs"))
    with pytest.raises(ConfigError, match=r"--nodes 3 but partition debug \(sinfo -p debug\) has 2 node\(s\)"):
        submit_job(spec, profile, resolve(spec, profile))
    assert not (tmp_path / "jobs").exists()  # nothing written


def test_a_refusal_in_torchrun_mode_is_the_jobs_first_failure_with_its_fix(tmp_path):
    """Each node's agent summarises a trainscale refusal in one line (`ranks 2-3 stopped: CheckpointError: ...
    (hint: ...)`), with no traceback: the job's explanation is that line, not "no rank left a traceback"."""
    rec = record(tmp_path, "torchrun")
    line = (
        "CheckpointError: runs/gpt/checkpoints/ckpt-00000011.pt is at step 11, at or past this run's last step 11 "
        "(--max-steps 11): resuming would train nothing (hint: to train on, raise --max-steps above 11)"
    )
    rec.job_dir.mkdir(parents=True, exist_ok=True)
    for node, ranks in (("0", "2-3"), ("1", "0-1")):
        (rec.job_dir / f"node-{node}.out").write_text(
            f"[rank2]: trainscale: error: {line}\ntrainscale: ranks {ranks} stopped: {line}\nPer-rank logs: x\n"
        )
    rec.batch_output.write_text("srun: error: n1: task 0: Exited with exit code 1\n")
    text = explain(JobInfo(job_id="42", name="gpt", state="FAILED", exit_code=1, signal=0), rec)
    assert f"First failing rank: rank 2 stopped: {line}" in text, text
    assert "no rank left a traceback" not in text and "left no Python traceback" not in text
    assert text.count("resuming would train nothing") == 1
