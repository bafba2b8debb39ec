"""Long runs and many runs, planned: chains, the requeue cap, the warning signal, sweeps, runs inside an
allocation, reproducible submissions (the real jobs are in tests/slurm/test_long_runs.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import pytest

from trainscale.errors import ConfigError
from trainscale.launch.allocation import attach_command, plan_spread
from trainscale.launch.slurm import SlurmJobSpec, render
from trainscale.launch.slurm.chains import chains
from trainscale.launch.slurm.jobdir import JobRecord
from trainscale.launch.slurm.layout import check_snapshot, target_in_run
from trainscale.launch.slurm.queue import JobInfo
from trainscale.launch.slurm.sweep import (
    choose_metric,
    configurations,
    gather,
    load_grid_file,
    parse_grid,
    ranked,
    task_args,
    write_tasks,
)
from trainscale.profiles.loader import builtin_profile_dir, profile_from_file

LOCAL = profile_from_file(builtin_profile_dir() / "local-test.toml")


def spec(**kw) -> SlurmJobSpec:
    return SlurmJobSpec(**({"workload": "cnn", "profile": "local-test", "time": "10", "run_name": "r"} | kw))


def bash_ok(text: str) -> None:
    done = subprocess.run(["bash", "-n"], input=text, text=True, capture_output=True)
    assert done.returncode == 0, done.stderr


# ------------------------------------------------------------------------------------------- chains and requeues
def test_chain_script_resumes_the_run_and_ends_the_chain():
    text = render(spec(chain=3), LOCAL)
    bash_ok(text)
    assert "#SBATCH --signal=USR1@120" in text  # a workload handles the warning: it gets one by default
    assert "export TRAINSCALE_ON_SIGNAL=stop" in text and '--checkpoint-dir "$RUN_DIR/checkpoints"' in text
    assert text.index('if [ -f "$RUN_DIR/finished" ] || [ -f "$RUN_DIR/failed" ]') < text.index("\nsrun ")
    assert 'echo "job $SLURM_JOB_ID" > "$RUN_DIR/finished"' in text and 'scancel "$link"' in text
    assert "which a next link would repeat" in text  # a failing link cancels the rest


def test_plain_script_gets_no_default_signal(tmp_path):
    plain = tmp_path / "plain.py"
    plain.write_text("print('no trainscale here')\n")
    text = render(spec(workload=None, script=str(plain), chain=2), LOCAL)
    assert "#SBATCH --signal" not in text  # SIGUSR1 would only kill it; the time limit ends each link
    assert "--signal=USR2@90" in render(spec(workload=None, script=str(plain), chain=2, signal="USR2@90"), LOCAL)


def test_requeue_cap_and_another_signal():
    text = render(spec(requeue=True, max_requeues=2, signal="USR2@60"), LOCAL)
    bash_ok(text)
    assert "export TRAINSCALE_MAX_REQUEUES=2" in text and "export TRAINSCALE_PREEMPT_SIGNALS=SIGUSR2" in text
    assert 'kill -USR2 "$SRUN_PID"' in text and "' USR2" in text  # the batch shell passes USR2 on
    assert 'if [ "${SLURM_RESTART_COUNT:-0}" -gt 2 ]; then' in text and "exit 75" in text


@pytest.mark.parametrize(
    "bad, fragment",
    [
        (dict(chain=0), "need a chain of 1 job or more"),
        (dict(max_requeues=-1), "0 requeues or more"),
        (dict(chain=2, array="0-3"), "a chain makes its own dependencies"),
        (dict(sweep=True), "a sweep is one array job"),
    ],
)
def test_long_run_options_refused(bad, fragment):
    with pytest.raises(ConfigError, match=fragment):
        spec(**bad)


def test_stop_or_cap_instead_of_requeue(tmp_path, monkeypatch):
    import trainscale
    from trainscale.runtime.preemption import Preemption

    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("TRAINSCALE_JOB_DIR", str(tmp_path))
    monkeypatch.setenv("TRAINSCALE_PREEMPT_SIGNALS", "SIGUSR2")
    with trainscale.init(device="cpu") as rt:
        pre = Preemption(rt)
        os.kill(os.getpid(), signal.SIGUSR2)  # the handler takes the configured signal, not SIGUSR1
        assert pre.requested() and pre.received == "SIGUSR2"
        monkeypatch.setenv("TRAINSCALE_ON_SIGNAL", "stop")
        assert pre.requeue() == "stopped for the next link of the chain"
        assert (tmp_path / "stopped").read_text().strip() == "stopped for the next link of the chain"
        monkeypatch.delenv("TRAINSCALE_ON_SIGNAL")
        monkeypatch.setenv("TRAINSCALE_MAX_REQUEUES", "2")
        monkeypatch.setenv("SLURM_RESTART_COUNT", "2")
        assert pre.requeue().startswith("requeue cap reached: requeued 2 time(s), --max-requeues 2")
        pre.restore()


def test_a_chain_is_one_line_with_its_links_states():
    records = [
        JobRecord(
            job_id=str(j),
            name="exp",
            launcher="srun",
            profile="p",
            script="s",
            output_dir="/o",
            world_size=4,
            ranks_per_node=2,
            run_dir="/o/exp-1",
            chain_link=i + 1,
        )
        for i, j in enumerate((11, 12, 13))
    ]
    queued = [JobInfo(job_id="12", state="RUNNING"), JobInfo(job_id="13", state="PENDING")]
    (chain,) = chains(records, queued, state_of=lambda job: {"11": "COMPLETED"}[job])
    assert chain.describe() == "11:COMPLETED 12:RUNNING 13:PENDING" and chain.state == "RUNNING"
    done = chains(records, [JobInfo(job_id="13", state="PENDING")], state_of=lambda job: "COMPLETED")
    assert done[0].state == "PENDING"
    assert not chains(records, [], state_of=lambda job: "COMPLETED")  # nothing queued: not listed


# --------------------------------------------------------------------------------------- reproducible submissions
def test_the_job_runs_the_runs_copy(tmp_path):
    project = tmp_path / "proj"
    (project / "pkg").mkdir(parents=True)
    script = project / "train.py"
    script.write_text("")
    run = tmp_path / "run"
    alone = target_in_run(str(script), None, project, run)
    assert alone.script == str(run / "src" / "proj" / "train.py") and alone.snapshot == str(run / "src" / "proj")
    assert alone.pythonpath is None  # found for you: imported as `trainscale run` imports it
    snap = target_in_run(str(script), str(project), project, run)
    assert snap.script == str(run / "src" / "proj" / "train.py") and snap.pythonpath == str(run / "src" / "proj")
    module = target_in_run(None, str(project), project, run)
    assert module.script is None and module.pythonpath == str(run / "src" / "proj")
    assert target_in_run(None, None, None, run).snapshot is None  # installed module or workload: no copy
    with pytest.raises(ConfigError, match="is not a directory"):
        check_snapshot(str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="is outside --snapshot"):
        check_snapshot(str(project / "pkg"), str(script))


# ---------------------------------------------------------------------------------------------------------- sweeps
def test_grid_forms_and_errors(tmp_path):
    grid = parse_grid("lr=1e-3,3e-4 batch_size=16,32")
    assert configurations(grid) == [
        {"lr": "1e-3", "batch_size": "16"},
        {"lr": "1e-3", "batch_size": "32"},
        {"lr": "3e-4", "batch_size": "16"},
        {"lr": "3e-4", "batch_size": "32"},
    ]
    path = tmp_path / "sweep.toml"
    path.write_text("[grid]\nlr = [1e-3, 3e-4]\nshuffle = [true]\n")
    assert load_grid_file(path) == {"lr": ["0.001", "0.0003"], "shuffle": ["true"]}
    for bad, fragment in (("lr", "is not KEY=V1,V2"), ("lr=1 lr=2", "twice"), ("", "is empty")):
        with pytest.raises(ConfigError, match=fragment):
            parse_grid(bad)
    path.write_text("lr = 1\n")
    with pytest.raises(ConfigError, match="has no \\[grid\\] table"):
        load_grid_file(path)
    assert task_args({"batch_size": "16"}, workload=False, task_dir="/t") == ["--batch_size", "16"]  # as written
    assert task_args({"batch_size": "16"}, workload=True, task_dir="/t")[:2] == ["--batch-size", "16"]


def test_gathered_results_best_first(tmp_path):
    write_tasks(tmp_path, {"lr": ["1", "2", "3"]}, workload=False)
    for i, loss in ((0, 0.5), (1, 0.2)):
        (tmp_path / f"task-{i}").mkdir()
        (tmp_path / f"task-{i}" / "metrics.json").write_text(json.dumps({"loss": loss, "note": "text"}))
        (tmp_path / f"task-{i}" / "finished").write_text("")
    (tmp_path / "task-2").mkdir()
    (tmp_path / "task-2" / "failed").write_text("exit code 1\n")
    results = gather(tmp_path)
    assert [r.state for r in results] == ["finished", "finished", "failed (exit code 1)"]
    metric = choose_metric(results, None)
    assert metric == "loss" and [r.index for r in ranked(results, metric)] == [1, 0, 2]
    assert [r.index for r in ranked(results, metric, higher_is_better=True)] == [0, 1, 2]
    assert (tmp_path / "tasks" / "2.args").read_text() == "--lr\n3\n"
    with pytest.raises(ConfigError, match="no task of the sweep logged the metric 'accuracy'"):
        choose_metric(results, "accuracy")
    for i in (0, 1):  # none logged any: the refusal says how to log one
        (tmp_path / f"task-{i}" / "metrics.json").unlink()
    with pytest.raises(ConfigError, match="no task of the sweep logged the metric 'loss'") as caught:
        choose_metric(gather(tmp_path), "loss")  # it said "best first by loss" of a table without it
    assert "rt.log({'loss': value})" in caught.value.hint
    with pytest.raises(ConfigError, match="is not a sweep's run directory"):
        gather(tmp_path / "task-0")


def test_a_submitted_sweep_s_unfinished_tasks_take_the_scheduler_s_states(tmp_path):
    """sweep status said `pending` of tasks squeue showed running (issue 38): a task with no result yet shows
    what the queue (squeue --array) says, then its accounting; a task the scheduler forgot says so."""
    import subprocess

    write_tasks(tmp_path, {"lr": ["1", "2", "3", "4", "5"]}, workload=False)
    data = json.loads((tmp_path / "sweep.json").read_text())
    (tmp_path / "sweep.json").write_text(json.dumps({**data, "jobs": ["77"]}))
    (tmp_path / "task-0").mkdir()
    (tmp_path / "task-0" / "finished").write_text("")
    asked = []

    def fake(argv, **_):
        asked.append(argv[0])
        out = ""
        if argv[0] == "squeue" and "--jobs=77" in argv:
            assert "--array" in argv
            out = "77_1|sweep|RUNNING|0:10|10:00|1|me|None|n1\n77_2|sweep|PENDING|0:00|10:00|1|me|Resources|\n"
        elif argv[0] == "sacct":  # the whole array in one call
            assert argv[2] == "77"
            out = "77_0|sweep|COMPLETED\n77_0.batch|batch|COMPLETED\n77_3|sweep|CANCELLED by 0\n"
        return subprocess.CompletedProcess(argv, 0, out, "")

    states = [r.state for r in gather(tmp_path, run=fake)]
    assert states == ["finished", "running", "pending (Resources)", "cancelled", "not in the queue, no result"]
    assert asked.count("sacct") == 1 and asked.count("squeue") == 1  # one call each for the whole array
    local = tmp_path / "local"
    write_tasks(local, {"lr": ["1"]}, workload=False)  # run here: no job, nothing asked
    asked.clear()
    assert [r.state for r in gather(local, run=fake)] == ["pending"] and not asked


def test_sweep_script_reads_its_task(tmp_path):
    text = render(spec(array="0-3%2", sweep=True), LOCAL)
    bash_ok(text)
    assert (
        "#SBATCH --array=0-3%2" in text
        and 'mapfile -t TASK_ARGS < "$RUN_DIR/tasks/${SLURM_ARRAY_TASK_ID}.args"' in text
    )
    assert '"${TASK_ARGS[@]}"' in text and 'date > "$TASK_DIR/finished"' in text


# ------------------------------------------------------------------------------------------- inside an allocation
ALLOC = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_CPUS_ON_NODE": "4"}


def test_spread_over_the_allocation():
    plan = plan_spread(["--nproc-per-node", "2"], ["train.py"], 2, frozenset(), ALLOC, python="py")
    assert plan.nodes == ["n1", "n2"] and plan.port_probe[:6] == [
        "srun",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        "-w",
        "n1",
    ]
    assert plan.launch[:6] == [
        "srun",
        "--overlap",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--cpus-per-task=4",
    ]
    i = plan.launch.index("--rdzv-endpoint")
    assert plan.launch[i - 2 : i + 2] == ["--rdzv-backend", "c10d", "--rdzv-endpoint", "n1:{port}"]
    assert plan.launch[-1] == "train.py" and plan.launch[plan.launch.index("run") + 1 :][:2] == [
        "--nproc-per-node",
        "2",
    ]
    assert plan_spread([], ["t.py"], 1, frozenset(), ALLOC) is None  # one node: stays here
    assert plan_spread([], ["t.py"], 2, frozenset({"rdzv_endpoint"}), ALLOC) is None  # placed by the user
    assert plan_spread([], ["t.py"], 2, frozenset(), {**ALLOC, "SLURM_STEP_ID": "0"}) is None  # already a task
    with pytest.raises(ConfigError, match="--nnodes 3 but this allocation \\(job 42\\) has 2 node\\(s\\)"):
        plan_spread([], ["t.py"], 3, frozenset(), ALLOC)


def test_attach_command():
    assert attach_command("42", "n2", ["hostname"]) == [
        "srun",
        "--jobid",
        "42",
        "--overlap",
        "--nodes=1",
        "--ntasks=1",
        "-w",
        "n2",
        "hostname",
    ]
    assert "--pty" in attach_command("42", None, [])


def test_cli_refusals(tmp_path, monkeypatch):
    import argparse

    from trainscale.cli import slurm as slurm_cli
    from trainscale.cli import sweep as sweep_cli

    monkeypatch.chdir(tmp_path)
    script = tmp_path / "t.py"
    script.write_text("")
    base = ["--profile", "local-test", "-t", "5"]
    with pytest.raises(ConfigError, match="--watch follows one job; a chain is several"):
        slurm_cli.run(argparse.Namespace(argv=[*base, "--chain", "2", "--submit", "--watch", str(script)]))
    with pytest.raises(ConfigError, match="exactly one of --grid or --grid-file"):
        sweep_cli.run(argparse.Namespace(argv=[*base, "--dry-run", str(script)]))
    with pytest.raises(ConfigError, match="--max-parallel 0 must be at least 1"):
        sweep_cli.run(
            argparse.Namespace(argv=[*base, "--grid", "lr=1,2", "--max-parallel", "0", "--dry-run", str(script)])
        )
    with pytest.raises(ConfigError, match="is not a directory"):
        slurm_cli.submit_and_watch(*_planned([*base, "--snapshot", "nowhere", "--submit", str(script)]))


def _planned(argv):
    import os

    from trainscale.cli.slurm import build
    from trainscale.launch.slurm import resolve

    spec, profile, ns, _ = build(argv, dict(os.environ))
    return spec, profile, resolve(spec, profile), ns
