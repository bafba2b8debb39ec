"""squeue / sacct / scontrol parsing on captured output, job_info's fallbacks and watch(), with faked commands."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from trainscale.errors import SlurmError
from trainscale.launch.slurm import queue
from trainscale.launch.slurm.queue import JobInfo, info_from_scontrol, parse_sacct, parse_scontrol, parse_squeue
from trainscale.launch.slurm.watch import describe_progress, explain, watch

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_parse_squeue_captured():
    jobs = parse_squeue(fixture("squeue_running_pending.txt"))
    by_id = {j.job_id: j for j in jobs}
    assert by_id["37"].state == "PENDING" and by_id["37"].name == "big" and by_id["37"].nodelist == ""
    assert by_id["35"].state == "RUNNING" and by_id["35"].nodelist == "n[1-2]" and by_id["35"].user == "root"
    assert by_id["35"].time_limit == "2:00" and by_id["35"].reason == ""  # "None" means no reason


def test_parse_squeue_rejects_other_formats():
    with pytest.raises(SlurmError, match="cannot read squeue line"):
        parse_squeue("  JOBID PARTITION NAME\n")


@pytest.mark.parametrize(
    "job, state, code, sig, reason, restarts",
    [
        ("4101", "COMPLETED", 0, 0, "", 0),
        ("4102", "FAILED", 1, 0, "", 0),
        ("4103", "CANCELLED", 0, 0, "by 1000", 0),
        ("4104", "OUT_OF_MEMORY", 0, 125, "", 0),
        ("4105", "TIMEOUT", 0, 0, "", 0),
        ("4106", "NODE_FAIL", 0, 0, "", 1),
        ("4107", "PREEMPTED", 0, 0, "", 2),
        ("4108", "REQUEUED", 0, 0, "", 1),
    ],
)
def test_parse_sacct_reads_the_job_and_its_steps(job, state, code, sig, reason, restarts):
    (info,) = [r for r in parse_sacct(fixture("sacct_examples.txt")) if r.job_id == job]
    assert (info.state, info.exit_code, info.signal, info.reason, info.restarts) == (state, code, sig, reason, restarts)
    assert info.terminal == (state != "REQUEUED")


def test_parse_sacct_keeps_every_line_in_order():
    rows = parse_sacct(fixture("sacct_examples.txt"))
    assert [r.job_id for r in rows[:4]] == ["4101", "4101.batch", "4101.extern", "4101.0"] and len(rows) == 14
    assert (rows[1].name, rows[1].nodelist, rows[1].alloc_cpus, rows[1].max_rss) == ("batch", "n1", 0, "")


@pytest.mark.parametrize(
    "name, state, code, reason",
    [
        ("scontrol_completed.txt", "COMPLETED", 0, ""),
        ("scontrol_failed.txt", "FAILED", 3, "NonZeroExitCode"),
        ("scontrol_timeout.txt", "TIMEOUT", 0, "TimeLimit"),
        ("scontrol_cancelled.txt", "CANCELLED", 0, ""),
        ("scontrol_running.txt", "RUNNING", 0, ""),
    ],
)
def test_scontrol_captured(name, state, code, reason):
    info = info_from_scontrol(fixture(name))
    assert (info.state, info.exit_code, info.reason) == (state, code, reason)
    assert info.source == "scontrol" and info.user == "root"


def test_parse_scontrol_keys_with_colons_and_values_with_spaces():
    fields = parse_scontrol("JobId=5 NtasksPerN:B:S:C=2:0:*:* Command=/a b/c.sh WorkDir=/w")
    assert fields["NtasksPerN:B:S:C"] == "2:0:*:*" and fields["Command"] == "/a b/c.sh" and fields["WorkDir"] == "/w"


class FakeSlurm:
    """Answers squeue/sacct/scontrol from a script of states, one step per squeue call."""

    def __init__(
        self, states: list[str], *, sacct: str | None = None, final: str = "scontrol_completed.txt", job: str = "35"
    ):
        self.states, self.sacct_text, self.final, self.job = list(states), sacct, final, job
        self.calls: list[list[str]] = []

    def __call__(self, argv, **kwargs):
        self.calls.append(argv)
        if argv[0] == "squeue":
            state = self.states.pop(0) if self.states else None
            if state is None:
                return subprocess.CompletedProcess(argv, 1, "", "slurm_load_jobs error: Invalid job id specified")
            return subprocess.CompletedProcess(argv, 0, f"{self.job}|train|{state}|0:05|10:00|2|root|None|n[1-2]\n", "")
        if argv[0] == "sacct":
            if self.sacct_text is None:
                return subprocess.CompletedProcess(argv, 1, "", "Slurm accounting storage is disabled\n")
            return subprocess.CompletedProcess(argv, 0, self.sacct_text, "")
        if argv[0] == "scontrol":
            return subprocess.CompletedProcess(argv, 0, fixture(self.final), "")
        raise AssertionError(argv)


def test_watch_follows_squeue_then_falls_back_to_scontrol():
    fake = FakeSlurm(["PENDING", "RUNNING", "RUNNING", "COMPLETING", None])
    seen = []
    info = watch("35", run=fake, poll_s=0, on_change=seen.append, sleep=lambda s: None)
    assert info.state == "COMPLETED" and info.source == "scontrol"
    assert [i.state for i in seen] == ["PENDING", "RUNNING", "COMPLETED"]  # COMPLETING is looked through
    assert any(c[0] == "sacct" for c in fake.calls)  # sacct was tried first


def test_watch_prefers_sacct_when_accounting_exists():
    fake = FakeSlurm(["RUNNING", None], sacct=fixture("sacct_examples.txt"), job="4102")
    info = watch("4102", run=fake, poll_s=0, sleep=lambda s: None)
    assert (info.state, info.exit_code, info.source) == ("FAILED", 1, "sacct")


def test_watch_reports_requeue_and_keeps_going():
    fake = FakeSlurm(["RUNNING", "REQUEUED", "PENDING", "RUNNING", None])
    seen = []
    watch("35", run=fake, poll_s=0, on_change=seen.append, sleep=lambda s: None)
    assert [i.state for i in seen][:4] == ["RUNNING", "REQUEUED", "PENDING", "RUNNING"]


def test_watch_timeout_names_the_state():
    fake = FakeSlurm(["RUNNING"] * 100)
    ticks = iter(range(1000))
    with pytest.raises(SlurmError, match="still RUNNING after 5s"):
        watch("35", run=fake, poll_s=0, timeout_s=5, clock=lambda: float(next(ticks)), sleep=lambda s: None)


def test_watch_unknown_job():
    def nothing(argv, **kwargs):
        return subprocess.CompletedProcess(argv, 1, "", "Invalid job id specified")

    with pytest.raises(SlurmError, match="not known to squeue, sacct or scontrol"):
        watch("77", run=nothing, poll_s=0, sleep=lambda s: None)


def test_missing_commands_are_explained():
    def missing(argv, **kwargs):
        raise FileNotFoundError(argv[0])

    with pytest.raises(SlurmError, match="`squeue` is not installed"):
        queue.squeue(missing)


@pytest.mark.parametrize(
    "state, words",
    [
        ("COMPLETED", "every task exited with code 0"),
        ("TIMEOUT", "time limit"),
        ("OUT_OF_MEMORY", "more memory"),
        ("NODE_FAIL", "lost a node"),
        ("CANCELLED", "cancelled"),
        ("PREEMPTED", "preempted"),
        ("REQUEUED", "requeued"),
    ],
)
def test_explain_each_state_in_words(state, words):
    text = explain(JobInfo(job_id="9", name="t", state=state, exit_code=0, signal=0))
    assert text.startswith(f"Job 9 (t) {state}: ") and words in text
    if state != "COMPLETED":
        assert "Hint:" in text


def test_explain_failed_with_exit_code():
    text = explain(next(r for r in parse_sacct(fixture("sacct_examples.txt")) if r.job_id == "4102"))
    assert "FAILED" in text and "exit code 1" in text


def test_describe_progress():
    assert describe_progress(JobInfo(job_id="1", state="RUNNING", nodelist="n[1-2]")) == "job 1: RUNNING on n[1-2]"
    assert describe_progress(JobInfo(job_id="1", state="PENDING", reason="Resources")) == "job 1: PENDING (Resources)"
