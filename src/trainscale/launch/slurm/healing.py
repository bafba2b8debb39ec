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
    return ['--nodes="$RUN_NODES"', f'--ntasks="$((RUN_NODES * {tasks_per_node}))"',
            '${LOST_NODES:+--exclude="$LOST_NODES"}']


def requeued_lines() -> list[str]:
    """The batch host's node fails the whole job (this shell dies with it), which no loop here can heal: SLURM
    requeues the job (it is submitted ``--requeue``) and schedules it without the down node. The requeued attempt
    names the node(s) of the last attempt SLURM reports down, as a recovery in the loop does."""
    return [
        "# the batch host's node fails the whole job: SLURM requeues it (--requeue) without the down node; this",
        "# attempt names the node(s) of the last one that are down now",
        'if [ "${SLURM_RESTART_COUNT:-0}" -gt 0 ] && [ -s "$JOB_DIR/nodes" ]; then',
        f'  gone=$(sinfo -h -N -n "$(cat "$JOB_DIR/nodes")" -t {DOWN_STATES} -o %N 2>/dev/null | sort -u | paste -sd, - '
        '|| true)',
        '  if [ -n "$gone" ]; then',
        '    mkdir -p "$RUN_DIR/metrics"',
        '    printf \'{"t": %s, "kind": "node_lost", "job": "%s", "nodes": "%s", "run_nodes": %s, "step": "%s", '
        '"message": "node(s) %s lost in job %s (the batch host: SLURM requeued the job): resumed on %s node(s) from '
        'checkpoint step %s"}\\n\' "$(date +%s)" "$SLURM_JOB_ID" "$gone" "$RUN_NODES" "$(newest_checkpoint)" "$gone" '
        '"$SLURM_JOB_ID" "$RUN_NODES" "$(newest_checkpoint)" >> "$RUN_DIR/metrics/events.jsonl"',
        '    echo "trainscale: node(s) $gone lost with the last attempt (the batch host\'s node ends the whole job); '
        'SLURM requeued it: resuming on $RUN_NODES node(s) ($SLURM_JOB_NODELIST) from the newest checkpoint '
        '(step $(newest_checkpoint))"',
        "  fi",
        "fi",
        'echo "$SLURM_JOB_NODELIST" > "$JOB_DIR/nodes"',
    ]


def guard_lines() -> list[str]:
    """SLURM keeps a ``--no-kill`` allocation even when the failed node is the batch host: the job would stay
    RUNNING with nothing in it until its time limit (seen on the test cluster). A guard step on another node of
    the allocation requeues the job once SLURM reports the batch host down."""
    return [
        "# the batch host's node can fail too: SLURM then keeps the allocation (--no-kill) with nothing running in",
        "# it; a guard on another node requeues the job once SLURM reports this node down",
        'GUARD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" 2>/dev/null | grep -vx "$SLURMD_NODENAME" '
        '| tail -n1 || true)',
        'if [ -n "$GUARD_NODE" ]; then',
        '  srun --overlap --nodes=1 --ntasks=1 --nodelist="$GUARD_NODE" --cpu-bind=none --job-name=heal-guard '
        '--output="$JOB_DIR/guard.out" --open-mode=append '
        "bash -c 'while sleep 10; do if sinfo -h -n \"$0\" -t down -o %N | grep -q .; then "
        "echo \"trainscale: the batch host $0 is down: requeueing job $1\"; scontrol requeue \"$1\"; exit 0; fi; done' "
        '"$SLURMD_NODENAME" "$SLURM_JOB_ID" &',
        "  GUARD_PID=$!",
        "fi",
    ]


def lines(spec: SlurmJobSpec, step: list[str], after: list[str], again: list[str]) -> list[str]:
    """The step (``step``: lines that run it once and leave its exit code in ``$status``) in a loop that leaves
    lost nodes out; ``again`` before each new try (a fresh rendezvous port: the failed step's may linger); then
    ``after`` (how the job ends, by ``$status``)."""
    low = spec.min_nodes or spec.nodes
    words = [f"--nodes {low}-{spec.nodes}" if low < spec.nodes else "",
             f"--spare-nodes {spec.spare_nodes}" if spec.spare_nodes else ""]
    said = ", ".join(w for w in words if w)
    return [
        f"# Self-healing ({said}): SLURM keeps the allocation when a node fails (--no-kill); the step starts",
        "# again without the lost node(s), on a spare or on fewer nodes (down to MIN), from the newest checkpoint.",
        f"MAX_NODES={spec.nodes} MIN_NODES={low}",
        'RUN_NODES=$(( SLURM_NNODES < MAX_NODES ? SLURM_NNODES : MAX_NODES ))',
        'LOST_NODES="" LAST_CKPT="" recovered=0',
        "# a node that dies fails the step before SLURM says so (it marks a silent node down after SlurmdTimeout):",
        "# a failed step with no node down yet waits that long for SLURM's verdict before it counts as the run's own",
        f"NODE_WAIT=${{{WAIT_VAR}:-$(scontrol show config 2>/dev/null | awk '/^SlurmdTimeout/ {{print $3; exit}}' "
        "|| true)}",
        'NODE_WAIT=${NODE_WAIT:-300}',
        "down_nodes() {",
        f'  sinfo -h -N -n "$SLURM_JOB_NODELIST" -t {DOWN_STATES} -o %N 2>/dev/null | sort -u | paste -sd, - || true',
        "}",
        "newest_checkpoint() {  # the newest complete checkpoint's step, where the run says it saves (progress)",
        '  local dir',
        '  dir=$(sed -n \'s/.*"directory": *"\\([^"]*\\)".*/\\1/p\' "$RUN_DIR/checkpoints.json" 2>/dev/null || true)',
        '  find "${dir:-$RUN_DIR/checkpoints}" -maxdepth 1 \\( -name "ckpt-[0-9]*.pt" -o -type d -name "ckpt-[0-9]*" \\) '
        '2>/dev/null | sed "s/.*ckpt-0*//; s/[.].*//" | sort -n | tail -n1 || true',
        "}",
        "newly_lost() {  # nodes of the allocation SLURM reports down that are not left out yet",
        '  comm -13 <(echo "$LOST_NODES" | tr , "\\n" | grep . | sort -u) <(down_nodes | tr , "\\n" | grep . | sort -u) '
        '| paste -sd, - || true',
        "}",
        *requeued_lines(),
        *guard_lines(),
        "while true; do",
        *["  " + line for line in step],
        '  [ "$status" -eq 0 ] && break',
        '  [ -f "$JOB_DIR/stopped" ] && break  # stopped with a checkpoint (time limit, preemption): as below',
        '  lost=$(newly_lost)',
        '  if [ -z "$lost" ]; then',
        '    echo "trainscale: the step failed (exit code $status) and SLURM reports no node lost yet: waiting up to '
        '$NODE_WAIT s for its verdict (SlurmdTimeout)"',
        "    waited=0",
        '    while [ "$waited" -lt "$NODE_WAIT" ]; do',
        '      sleep 5; waited=$((waited + 5)); lost=$(newly_lost)',
        '      if [ -n "$lost" ]; then break; fi',
        "    done",
        "  fi",
        '  if [ -z "$lost" ]; then break; fi  # no node lost: the failure is the run\'s',
        '  ckpt=$(newest_checkpoint)',
        '  if [ "$recovered" -gt 0 ] && [ "$ckpt" = "$LAST_CKPT" ]; then',
        '    echo "trainscale: node(s) $lost lost, but the run made no progress since the last recovery (newest '
        'checkpoint: step ${ckpt:-none}): stopping instead of looping (exit code $status)"',
        "    break",
        "  fi",
        '  all=$(echo "$LOST_NODES,$lost" | tr , "\\n" | grep . | sort -u | paste -sd, -)  # every node left out so far',
        '  alive=$(( SLURM_NNODES - $(echo "$all" | tr , "\\n" | grep -c . || true) ))',
        '  if [ "$alive" -lt "$MIN_NODES" ]; then',
        '    echo "trainscale: node(s) $lost lost; $alive node(s) left, fewer than MIN $MIN_NODES: the job ends '
        '(exit code $status); resubmit it to resume from the newest checkpoint"',
        "    break",
        "  fi",
        '  RUN_NODES=$(( alive < MAX_NODES ? alive : MAX_NODES )) LOST_NODES=$all LAST_CKPT=$ckpt '
        'recovered=$((recovered + 1))',
        '  mkdir -p "$RUN_DIR/metrics"',
        '  printf \'{"t": %s, "kind": "node_lost", "job": "%s", "nodes": "%s", "run_nodes": %s, "step": "%s", '
        '"message": "node(s) %s lost in job %s: resumed on %s node(s) from checkpoint step %s"}\\n\' '
        '"$(date +%s)" "$SLURM_JOB_ID" "$lost" "$RUN_NODES" "${ckpt:-0}" "$lost" "$SLURM_JOB_ID" "$RUN_NODES" '
        '"${ckpt:-0}" >> "$RUN_DIR/metrics/events.jsonl"',
        '  echo "trainscale: node(s) $lost lost (SLURM: down, failed or not responding); resuming on $RUN_NODES '
        'node(s) without them, from the newest checkpoint (step ${ckpt:-0})"',
        *["  " + line for line in again],
        "done",
        'if [ -n "${GUARD_PID:-}" ]; then kill "$GUARD_PID" 2>/dev/null || true; fi',
        *after,
    ]
