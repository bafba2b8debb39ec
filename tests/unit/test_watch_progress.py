"""`trainscale slurm --watch` shows the running job's training, not only PENDING/RUNNING/COMPLETED: step, pace,
loss and ETA from the ranks' records in the run directory (issue 38 item 6), and ends with the next command."""

from __future__ import annotations

import io
import json

from trainscale.launch.slurm.queue import JobInfo
from trainscale.launch.slurm.watch import training_progress


def run_dir(tmp_path, *, total=None, loss=True):
    metrics = tmp_path / "metrics"
    metrics.mkdir(parents=True)
    meta = {"kind": "meta", "rank": 0, "t": 1000.0, **({"total_steps": total} if total else {})}
    steps = [{"kind": "step", "step": s, "t": 1000.0 + s, "step_s": 0.5 if s % 2 else 0.4} for s in range(1, 41)]
    (metrics / "rank-0.jsonl").write_text("\n".join(json.dumps(r) for r in [meta, *steps]) + "\n")
    if loss:
        (tmp_path / "metrics.csv").write_text("step,key,value\n0,train/loss,2.5\n1,train/loss,1.25\n")
    return tmp_path


def test_progress_reads_step_pace_loss_and_eta(tmp_path):
    said = training_progress(run_dir(tmp_path / "a", total=100), now=1090.0)
    assert said == "step 40 of 100, 0.5 s/step, loss 1.25, training for 1:30, ETA 0:30"
    said = training_progress(run_dir(tmp_path / "b", loss=False), now=1005.0)  # a script: no total, no loss logged
    assert said == "step 40, 0.5 s/step, training for 0:05"
    assert training_progress(tmp_path / "nothing") is None and training_progress(None) is None


def test_watch_lines_change_at_most_every_30_s_off_a_terminal(tmp_path):
    from trainscale.cli.slurm import Progress

    stream, now = io.StringIO(), [1000.0]
    where = run_dir(tmp_path, total=100)
    progress = Progress(where, stream=stream, clock=lambda: now[0])
    running = JobInfo(job_id="7", name="x", state="RUNNING")
    progress.say("job 7: RUNNING on n1")
    progress.poll(running)
    progress.poll(JobInfo(job_id="7", name="x", state="PENDING"))  # not running: nothing to say
    with open(where / "metrics" / "rank-0.jsonl", "a") as fh:  # the job trains on
        fh.write(json.dumps({"kind": "step", "step": 41, "t": 1041.0, "step_s": 0.5}) + "\n")
    now[0] += 10
    progress.poll(running)  # changed, but 10 s after the last line: not yet
    now[0] += 25
    progress.poll(running)  # 35 s: the new step is said
    lines = stream.getvalue().splitlines()
    assert lines[0] == "trainscale slurm: job 7: RUNNING on n1"
    assert lines[1].startswith("trainscale slurm: job 7: step 40 of 100, 0.5 s/step, loss 1.25")
    assert len(lines) == 3 and lines[2].startswith("trainscale slurm: job 7: step 41 of 100")
