"""The self-healing loop of a batch script (launch/slurm/healing.py), run by bash with srun and sinfo faked at
the process boundary: a node lost is left out and the step starts again; the job ends on a failure with no node
lost, below MIN nodes, and on a crash loop (a node lost again with no newer checkpoint). The real thing, on the
3-node test cluster: tests/slurm/test_self_healing.py."""

from __future__ import annotations

import subprocess
import textwrap
import types

import pytest

from trainscale.errors import ConfigError
from trainscale.launch.slurm import healing
from trainscale.launch.slurm.render import render
from trainscale.launch.slurm.sources import spec_values
from trainscale.launch.slurm.spec import SlurmJobSpec
from trainscale.profiles import load_profile

FAKES = (
    r"""
set -euo pipefail
SLURM_NNODES=3 SLURM_JOB_NODELIST="n[1-3]" SLURM_JOB_ID=7 RUN_DIR="$PWD" JOB_DIR="$PWD/7" SLURMD_NODENAME=n1
mkdir -p "$JOB_DIR"
TRAINSCALE_NODE_WAIT=${TRAINSCALE_NODE_WAIT:-0}
scontrol() { if [ "$1" = show ] && [ "$2" = hostnames ]; then printf "n1\nn2\nn3\n"; """
    r"""else echo "SlurmdTimeout           = 300 sec"; fi; }
tries=0
sinfo() { [ -f down ] && sort down || true; }
step() {  # one try: says where it runs; a node dies (or not) and, with progress, a newer checkpoint appears
  tries=$((tries + 1))
  echo "try $tries on $RUN_NODES node(s) excluding ${LOST_NODES:-none}, port $MASTER_PORT"
  [ -n "${DIES[$tries]:-}" ] && echo "${DIES[$tries]}" >> down
  [ -n "${BACK[$tries]:-}" ] && sed -i "/^${BACK[$tries]}\$/d" down  # returned to service, still not the job's
  [ -n "${PROGRESS:-}" ] && mkdir -p checkpoints && touch "checkpoints/ckpt-0000000$tries.pt"
  [ "$tries" -ge "${SUCCEED_AT:-99}" ] && return 0
  return "${EXIT:-1}"
}
"""
)


def run(tmp_path, spec: SlurmJobSpec, setup: str) -> subprocess.CompletedProcess[str]:
    body = healing.lines(
        spec, ["step && status=0 || status=$?"], ['exit "$status"'], again=["MASTER_PORT=$((MASTER_PORT + 1))"]
    )
    script = FAKES + "MASTER_PORT=100\n" + textwrap.dedent(setup) + "\n".join(body) + "\n"
    return subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=30)


SPEC = dict(workload="cnn", time="10", profile="local-test")


def test_a_node_lost_is_left_out_until_the_run_ends_well(tmp_path):
    done = run(tmp_path, SlurmJobSpec(nodes=3, min_nodes=2, **SPEC), "DIES=([1]=n3); PROGRESS=1 SUCCEED_AT=2\n")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "try 1 on 3 node(s) excluding none, port 100" in done.stdout
    assert "node(s) n3 lost" in done.stdout and "resuming on 2 node(s)" in done.stdout
    assert "try 2 on 2 node(s) excluding n3, port 101" in done.stdout  # a fresh rendezvous port
    assert (
        '"kind": "node_lost", "job": "7", "nodes": "n3", "run_nodes": 2'
        in (tmp_path / "metrics" / "events.jsonl").read_text()
    )


def test_a_failure_with_no_node_lost_is_the_runs_own_and_ends_the_job(tmp_path):
    done = run(tmp_path, SlurmJobSpec(nodes=3, min_nodes=2, **SPEC), "EXIT=3\n")
    assert done.returncode == 3 and "try 2" not in done.stdout and "resuming" not in done.stdout, done.stdout
    assert "SLURM reports no node lost yet: waiting up to 0 s" in done.stdout


def test_a_node_slurm_marks_down_only_after_the_step_failed_is_still_healed(tmp_path):
    """A dead node fails the step at once; SLURM marks it down later (SlurmdTimeout): the loop waits for that."""
    done = run(
        tmp_path,
        SlurmJobSpec(nodes=3, min_nodes=2, **SPEC),
        "TRAINSCALE_NODE_WAIT=60 SUCCEED_AT=2\nsleep() { echo n3 > down; }\n",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "waiting up to 60 s" in done.stdout and "node(s) n3 lost" in done.stdout and "try 2 on 2" in done.stdout


def test_the_wait_defaults_to_the_clusters_slurmd_timeout(tmp_path):
    done = run(
        tmp_path,
        SlurmJobSpec(nodes=3, min_nodes=2, **SPEC),
        "unset TRAINSCALE_NODE_WAIT; EXIT=3\nsleep() { echo n1 > down; }\n",
    )
    assert "waiting up to 300 s" in done.stdout, done.stdout


def test_a_crash_loop_stops_instead_of_burning_the_allocation(tmp_path):
    done = run(tmp_path, SlurmJobSpec(nodes=3, min_nodes=1, **SPEC), "DIES=([1]=n3 [2]=n2)\n")
    assert done.returncode == 1
    assert "node(s) n3 lost" in done.stdout and "try 2 on 2 node(s) excluding n3" in done.stdout
    assert "node(s) n2 lost, but the run made no progress since the last recovery" in done.stdout, done.stdout
    assert "try 3" not in done.stdout


def test_fewer_nodes_than_min_end_the_job_saying_how_to_resume(tmp_path):
    done = run(tmp_path, SlurmJobSpec(nodes=3, min_nodes=2, **SPEC), "DIES=([1]=n3 [2]=n2); PROGRESS=1\n")
    assert done.returncode == 1
    assert "1 node(s) left, fewer than MIN 2: the job ends (exit code 1); resubmit it" in done.stdout, done.stdout


def test_a_spare_takes_the_lost_nodes_place(tmp_path):
    done = run(tmp_path, SlurmJobSpec(nodes=2, spare_nodes=1, **SPEC), "DIES=([1]=n2 [2]=n1); PROGRESS=1\n")
    assert "try 1 on 2 node(s) excluding none" in done.stdout and "try 2 on 2 node(s) excluding n2" in done.stdout
    assert "1 node(s) left, fewer than MIN 2" in done.stdout, done.stdout


def test_the_batch_script_allocates_max_and_spares_with_no_kill_and_runs_on_run_nodes():
    for spec, nodes in (
        (SlurmJobSpec(nodes=4, min_nodes=2, launcher="torchrun", **SPEC), 4),
        (SlurmJobSpec(nodes=2, spare_nodes=1, launcher="srun", **SPEC), 3),
    ):
        text = render(spec, load_profile("local-test"))
        assert f"#SBATCH --nodes={nodes}\n" in text and "#SBATCH --no-kill\n" in text
        assert '--nodes="$RUN_NODES"' in text and '${LOST_NODES:+--exclude="$LOST_NODES"}' in text
        assert ('--nnodes "$RUN_NODES"' in text) == (spec.launcher == "torchrun")
        assert '--checkpoint-dir "$RUN_DIR/checkpoints"' in text  # a workload resumes from the run's
    plain = render(SlurmJobSpec(nodes=2, **SPEC), load_profile("local-test"))
    assert "--no-kill" not in plain and "RUN_NODES" not in plain


@pytest.mark.parametrize(
    "given, message",
    [
        ({"nodes": "3-2"}, "MIN must be 1 to MAX"),
        ({"nodes": "two-3"}, "is not N or MIN-MAX"),
        ({"nodes": "2", "spare_nodes": -1}, "spare nodes"),
        ({"nodes": "1-2", "sweep": True, "array": "0-3"}, "each array task is its own job"),
    ],
)
def test_bad_node_counts_are_refused_naming_the_fix(given, message):
    with pytest.raises(ConfigError, match=message):
        SlurmJobSpec(**SPEC, **spec_values(given))


def test_nodes_min_max_reads_as_sbatch_spells_it():
    assert spec_values({"nodes": "2-4"}) == {"nodes": 4, "min_nodes": 2}
    assert spec_values({"nodes": "3"}) == {"nodes": 3}


def test_a_lost_node_returned_to_service_stays_left_out(tmp_path):
    """SLURM may resume a node the job lost (ReturnToService): it is no node of this job's any more, and counts
    as lost when the next one dies."""
    done = run(
        tmp_path, SlurmJobSpec(nodes=3, min_nodes=2, **SPEC), "DIES=([1]=n3 [2]=n2); BACK=([2]=n3); PROGRESS=1\n"
    )
    assert "try 2 on 2 node(s) excluding n3" in done.stdout
    assert "node(s) n2 lost; 1 node(s) left, fewer than MIN 2" in done.stdout, done.stdout


def test_watch_requeues_a_job_whose_batch_host_is_down_and_the_next_attempt_names_it(tmp_path):
    """SLURM keeps a --no-kill job whose batch host died RUNNING with nothing in it: --watch marks the host lost
    and requeues the job (a fake scontrol/sinfo here; the real one: tests/slurm/test_self_healing.py); the
    requeued attempt names it once and resumes."""
    calls, said = [], []

    def slurm(argv, **_):
        calls.append(argv)
        out = {
            "scontrol": "JobId=7 JobState=RUNNING BatchHost=n1 NodeList=n[2-3] Partition=debug "
            "NtasksPerN:B:S:C=4:0:*:*",
            "sinfo": "n1 down*\nn2 mix\nn3 idle\n" if "-p" in argv else "n1\n",
        }.get(argv[0], "")
        return subprocess.CompletedProcess(argv, 0, out, "")

    (tmp_path / "7").mkdir()
    watch = healing.BatchHostWatch(
        "7", str(tmp_path / "7"), nodes=3, min_nodes=2, run=slurm, say=said.append, clock=lambda: 0.0
    )
    watch.poll(types.SimpleNamespace(state="PENDING"))
    assert calls == []  # only a running job is looked at
    watch.poll(types.SimpleNamespace(state="RUNNING"))
    assert ["scontrol", "requeue", "7"] in calls and "requeued it" in said[0]
    # 2 of its partition's nodes are up: the requeued job asks for those rather than wait for the third
    assert [
        "scontrol",
        "update",
        "jobid=7",
        "NumNodes=2",
        "NumTasks=8",
    ] in calls and "asks for 2 (of 3; --nodes MIN 2)" in said[0]
    assert (tmp_path / "7" / "batch-host-lost").read_text() == "n1\n"
    again = run(
        tmp_path,
        SlurmJobSpec(nodes=3, min_nodes=2, **SPEC),
        "SLURM_RESTART_COUNT=1 SLURM_JOB_NODELIST=n[2-3] SUCCEED_AT=1 PROGRESS=1\n",
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert (
        "node(s) n1 lost with the last attempt (the batch host's node ends the whole job); the job was "
        "requeued" in again.stdout
    ), again.stdout
    events = (tmp_path / "metrics" / "events.jsonl").read_text()
    assert '"kind": "node_lost", "job": "7", "nodes": "n1"' in events and "the batch host" in events
    assert not (tmp_path / "7" / "batch-host-lost").exists()  # named once: a later requeue (time limit) is not a loss
    first = run(tmp_path, SlurmJobSpec(nodes=3, min_nodes=2, **SPEC), "SUCCEED_AT=1\n")
    assert "lost with the last attempt" not in first.stdout


def test_a_batch_host_lost_past_the_requeue_cap_stops_and_no_requeue_cancels(tmp_path):
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "batch-host-lost").write_text("n1\n")
    capped = run(
        tmp_path, SlurmJobSpec(nodes=3, min_nodes=2, max_requeues=2, **SPEC), "SLURM_RESTART_COUNT=3 SUCCEED_AT=1\n"
    )
    assert capped.returncode == 75 and "requeued 3 times, more than --max-requeues 2" in capped.stdout
    calls = []

    def slurm(argv, **_):
        calls.append(argv)
        out = {"scontrol": "BatchHost=n1", "sinfo": "n1\n"}.get(argv[0], "")
        return subprocess.CompletedProcess(argv, 0, out, "")

    healing.BatchHostWatch(
        "7",
        str(tmp_path / "7"),
        nodes=3,
        min_nodes=2,
        requeue=False,
        run=slurm,
        say=lambda line: None,
        clock=lambda: 0.0,
    ).poll(types.SimpleNamespace(state="RUNNING"))
    assert ["scancel", "7"] in calls and not any(c[:2] == ["scontrol", "requeue"] for c in calls)
