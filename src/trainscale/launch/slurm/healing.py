"""How a job outlives a node (pure; golden-tested): ``--nodes MIN-MAX`` and ``--spare-nodes K``.

The job is allocated with ``--no-kill``, so SLURM keeps it when one of its nodes fails. The batch step runs
the training step on ``RUN_NODES`` of the allocation; when that step fails and SLURM reports nodes of the
allocation down, failed or not responding, they are left out (``--exclude``) and the step starts again on
the nodes that are left — a spare first, else fewer, down to MIN — resuming from the newest checkpoint (the
global data cursor: every sample once, whatever the number of ranks). A failure with no node lost is the
run's own and ends the job; so does a lost node after which the run made no progress (no newer checkpoint
than at the previous recovery), instead of burning the allocation on a crash loop. Each recovery is a
``node_lost`` event in the run's ``metrics/events.jsonl`` (report) and a line in the job's output. The
behaviour: docs/slurm.md, "Self-healing jobs".
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

from trainscale.launch.slurm.continuation import EXIT_STOPPED
from trainscale.launch.slurm.spec import SlurmJobSpec

WAIT_VAR = "TRAINSCALE_NODE_WAIT"
"""Seconds a failed step waits for SLURM to report a node down (default: the cluster's SlurmdTimeout)."""
DOWN_STATES = "down,drain,fail,no_respond"
"""sinfo states of a node the job must leave out (``sinfo -t``)."""


def allocated(spec: SlurmJobSpec) -> str:
    """sbatch's ``--nodes``: MAX and the spares. Not MIN-MAX itself: given a range, SLURM starts the job on as
    few as MIN nodes (seen on the test cluster with all its nodes idle); MIN is the floor of the recovery."""
    return str(spec.nodes + spec.spare_nodes)


def srun_options(tasks_per_node: int) -> list[str]:
    """The step on the nodes the job runs on now, without the lost ones."""
    return [
        '--nodes="$RUN_NODES"',
        f'--ntasks="$((RUN_NODES * {tasks_per_node}))"',
        '${LOST_NODES:+--exclude="$LOST_NODES"}',
    ]


def requeued_lines(spec: SlurmJobSpec) -> list[str]:
    """The batch host's node fails the whole job (this shell dies with it), which no loop here can heal: SLURM
    keeps a ``--no-kill`` job RUNNING with nothing in it and ends every step on the other nodes too (seen on
    SLURM 22.05; no step can stand guard). ``--watch`` (:class:`BatchHostWatch`) leaves ``batch-host-lost`` in the
    job directory and requeues the job, which SLURM schedules without the down node. The requeued attempt names
    that node as a recovery in the loop does, and stops once the job was requeued more than ``--max-requeues``
    times (a batch host lost again and again)."""
    return [
        "# a requeued attempt after --watch found the batch host down (the job was requeued without it)",
        'if [ -s "$JOB_DIR/batch-host-lost" ]; then',
        '  gone=$(cat "$JOB_DIR/batch-host-lost"); rm -f "$JOB_DIR/batch-host-lost"',
        f'  if [ "${{SLURM_RESTART_COUNT:-0}}" -gt {spec.max_requeues} ]; then',
        f'    echo "trainscale: the batch host $gone was lost; job $SLURM_JOB_ID was requeued $SLURM_RESTART_COUNT '
        f'times, more than --max-requeues {spec.max_requeues}: it stops here (resume: submit the run again)"',
        f"    exit {EXIT_STOPPED}",
        "  fi",
        '  mkdir -p "$RUN_DIR/metrics"',
        '  printf \'{"t": %s, "kind": "node_lost", "job": "%s", "nodes": "%s", "run_nodes": %s, "step": "%s", '
        '"message": "node(s) %s lost in job %s (the batch host: the job was requeued): resumed on %s node(s) from '
        'checkpoint step %s"}\\n\' "$(date +%s)" "$SLURM_JOB_ID" "$gone" "$RUN_NODES" "$(newest_checkpoint)" "$gone" '
        '"$SLURM_JOB_ID" "$RUN_NODES" "$(newest_checkpoint)" >> "$RUN_DIR/metrics/events.jsonl"',
        "  echo \"trainscale: node(s) $gone lost with the last attempt (the batch host's node ends the whole job); "
        "the job was requeued: resuming on $RUN_NODES node(s) ($SLURM_JOB_NODELIST) from the newest checkpoint "
        '(step $(newest_checkpoint))"',
        "fi",
    ]


def lines(spec: SlurmJobSpec, step: list[str], after: list[str], again: list[str]) -> list[str]:
    """The step (``step``: lines that run it once and leave its exit code in ``$status``) in a loop that leaves
    lost nodes out; ``again`` before each new try (a fresh rendezvous port: the failed step's may linger); then
    ``after`` (how the job ends, by ``$status``)."""
    low = spec.min_nodes or spec.nodes
    words = [
        f"--nodes {low}-{spec.nodes}" if low < spec.nodes else "",
        f"--spare-nodes {spec.spare_nodes}" if spec.spare_nodes else "",
    ]
    said = ", ".join(w for w in words if w)
    return [
        f"# Self-healing ({said}): SLURM keeps the allocation when a node fails (--no-kill); the step starts",
        "# again without the lost node(s), on a spare or on fewer nodes (down to MIN), from the newest checkpoint.",
        f"MAX_NODES={spec.nodes} MIN_NODES={low}",
        "RUN_NODES=$(( SLURM_NNODES < MAX_NODES ? SLURM_NNODES : MAX_NODES ))",
        'LOST_NODES="" LAST_CKPT="" recovered=0',
        "# a node that dies fails the step before SLURM says so (it marks a silent node down after SlurmdTimeout):",
        "# a failed step with no node down yet waits that long for SLURM's verdict before it counts as the run's own",
        f"NODE_WAIT=${{{WAIT_VAR}:-$(scontrol show config 2>/dev/null | awk '/^SlurmdTimeout/ {{print $3; exit}}' "
        "|| true)}",
        "NODE_WAIT=${NODE_WAIT:-300}",
        "down_nodes() {",
        f'  sinfo -h -N -n "$SLURM_JOB_NODELIST" -t {DOWN_STATES} -o %N 2>/dev/null | sort -u | paste -sd, - || true',
        "}",
        "newest_checkpoint() {  # the newest complete checkpoint's step, where the run says it saves (progress)",
        "  local dir",
        '  dir=$(sed -n \'s/.*"directory": *"\\([^"]*\\)".*/\\1/p\' "$RUN_DIR/checkpoints.json" 2>/dev/null || true)',
        '  find "${dir:-$RUN_DIR/checkpoints}" -maxdepth 1 '
        '\\( -name "ckpt-[0-9]*.pt" -o -type d -name "ckpt-[0-9]*" \\) '
        '2>/dev/null | sed "s/.*ckpt-0*//; s/[.].*//" | sort -n | tail -n1 || true',
        "}",
        "newly_lost() {  # nodes of the allocation SLURM reports down that are not left out yet",
        '  comm -13 <(echo "$LOST_NODES" | tr , "\\n" | grep . | sort -u) '
        '<(down_nodes | tr , "\\n" | grep . | sort -u) '
        "| paste -sd, - || true",
        "}",
        *requeued_lines(spec),
        "while true; do",
        *["  " + line for line in step],
        '  [ "$status" -eq 0 ] && break',
        '  [ -f "$JOB_DIR/stopped" ] && break  # stopped with a checkpoint (time limit, preemption): as below',
        "  lost=$(newly_lost)",
        '  if [ -z "$lost" ]; then',
        '    echo "trainscale: the step failed (exit code $status) and SLURM reports no node lost yet: waiting up to '
        '$NODE_WAIT s for its verdict (SlurmdTimeout)"',
        "    waited=0",
        '    while [ "$waited" -lt "$NODE_WAIT" ]; do',
        "      sleep 5; waited=$((waited + 5)); lost=$(newly_lost)",
        '      if [ -n "$lost" ]; then break; fi',
        "    done",
        "  fi",
        '  if [ -z "$lost" ]; then break; fi  # no node lost: the failure is the run\'s',
        "  ckpt=$(newest_checkpoint)",
        '  if [ "$recovered" -gt 0 ] && [ "$ckpt" = "$LAST_CKPT" ]; then',
        '    echo "trainscale: node(s) $lost lost, but the run made no progress since the last recovery (newest '
        'checkpoint: step ${ckpt:-none}): stopping instead of looping (exit code $status)"',
        "    break",
        "  fi",
        '  all=$(echo "$LOST_NODES,$lost" | tr , "\\n" | grep . | sort -u | paste -sd, -)  '
        "# every node left out so far",
        '  alive=$(( SLURM_NNODES - $(echo "$all" | tr , "\\n" | grep -c . || true) ))',
        '  if [ "$alive" -lt "$MIN_NODES" ]; then',
        '    echo "trainscale: node(s) $lost lost; $alive node(s) left, fewer than MIN $MIN_NODES: the job ends '
        '(exit code $status); resubmit it to resume from the newest checkpoint"',
        "    break",
        "  fi",
        "  RUN_NODES=$(( alive < MAX_NODES ? alive : MAX_NODES )) LOST_NODES=$all LAST_CKPT=$ckpt "
        "recovered=$((recovered + 1))",
        '  mkdir -p "$RUN_DIR/metrics"',
        '  printf \'{"t": %s, "kind": "node_lost", "job": "%s", "nodes": "%s", "run_nodes": %s, "step": "%s", '
        '"message": "node(s) %s lost in job %s: resumed on %s node(s) from checkpoint step %s"}\\n\' '
        '"$(date +%s)" "$SLURM_JOB_ID" "$lost" "$RUN_NODES" "${ckpt:-0}" "$lost" "$SLURM_JOB_ID" "$RUN_NODES" '
        '"${ckpt:-0}" >> "$RUN_DIR/metrics/events.jsonl"',
        '  echo "trainscale: node(s) $lost lost (SLURM: down, failed or not responding); resuming on $RUN_NODES '
        'node(s) without them, from the newest checkpoint (step ${ckpt:-0})"',
        *["  " + line for line in again],
        "done",
        *after,
    ]


LOST_MARKER = "batch-host-lost"
"""Left in the job directory by :class:`BatchHostWatch` before it requeues the job: the host's name."""


class BatchHostWatch:
    """``--watch`` of a self-healing job: SLURM keeps a ``--no-kill`` job whose batch host went down RUNNING, with
    nothing left in it, until its time limit. Once SLURM reports the batch host down, this marks it lost in the
    job directory and requeues the job (``scontrol requeue``), or cancels it when it may not be requeued."""

    def __init__(
        self,
        job_id: str,
        job_dir: str,
        *,
        nodes: int,
        min_nodes: int,
        requeue: bool = True,
        run: Any = None,
        say: Any = print,
        every_s: float = 10.0,
        clock: Any = None,
    ) -> None:
        self.job_id, self.job_dir, self.requeue, self.run, self.say = job_id, job_dir, requeue, run, say
        self.nodes, self.min_nodes = nodes, min_nodes
        """What the job asks for (MAX and the spares) and the least it runs on (MIN)."""
        self.every_s, self.clock, self._next = every_s, clock or time.monotonic, 0.0

    def _ask(self, argv: list[str]) -> str:
        try:
            done = (self.run or subprocess.run)(argv, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        return done.stdout if done.returncode == 0 else ""

    def poll(self, info: Any) -> None:
        if info.state != "RUNNING" or self.clock() < self._next:
            return
        self._next = self.clock() + self.every_s
        from trainscale.launch.slurm.queue import parse_scontrol  # noqa: PLC0415 (CLI start-up)

        fields = parse_scontrol(self._ask(["scontrol", "show", "job", "-o", self.job_id]))
        host = fields.get("BatchHost", "")
        if not host or not self._ask(["sinfo", "-h", "-N", "-n", host, "-t", "down", "-o", "%N"]).strip():
            return

        if self.requeue:
            (Path(self.job_dir) / LOST_MARKER).write_text(host + "\n")
            self._ask(["scontrol", "requeue", self.job_id])
            self.say(
                f"the batch host {host} of job {self.job_id} is down, and SLURM keeps a --no-kill "
                "job running with nothing in it: requeued it, to resume without the node" + self._fewer(fields)
            )
        else:
            self._ask(["scancel", self.job_id])
            self.say(
                f"the batch host {host} of job {self.job_id} is down and the job may not be "
                "requeued (--no-requeue): cancelled it rather than let it hold its nodes to the time limit"
            )

    def _fewer(self, fields: dict[str, str]) -> str:
        """The requeued job asks for its nodes again: where its partition has fewer up (not down, drained or
        failing), ask for those, down to MIN (``--nodes MIN-MAX``), rather than wait for the lost one."""
        asked = self.nodes
        states = self._ask(["sinfo", "-h", "-N", "-p", fields.get("Partition", ""), "-o", "%N %t"]).split("\n")
        gone = tuple(DOWN_STATES.split(",")) + ("maint",)  # sinfo's short states start with these words
        up = len(
            {
                line.split()[0]
                for line in states
                if len(line.split()) == 2 and not line.split()[1].rstrip("*~#!%$@^-").startswith(gone)
            }
        )
        if up >= asked or up < self.min_nodes:
            return ""
        per_node = int(fields.get("NtasksPerN:B:S:C", "0").split(":")[0] or 0)  # --ntasks-per-node: tasks follow
        self._ask(
            [
                "scontrol",
                "update",
                f"jobid={self.job_id}",
                f"NumNodes={up}",
                *([f"NumTasks={up * per_node}"] if per_node else []),
            ]
        )
        return f"; its partition has {up} node(s) up, so it asks for {up} (of {asked}; --nodes MIN {self.min_nodes})"
