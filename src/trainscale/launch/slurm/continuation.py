"""How a job continues past its time limit: requeues (capped) and chains of jobs (pure; golden-tested).

On SLURM's warning signal the ranks checkpoint at a step boundary (runtime/preemption.py), then requeue or
stop by what the batch script exported here; the behaviour: docs/slurm.md, "Long runs: chains and capped
requeues".
"""

from __future__ import annotations

from trainscale.launch.slurm.spec import SlurmJobSpec

ON_SIGNAL_VAR = "TRAINSCALE_ON_SIGNAL"
MAX_REQUEUES_VAR = "TRAINSCALE_MAX_REQUEUES"
SIGNALS_VAR = "TRAINSCALE_PREEMPT_SIGNALS"
JOB_END_VAR = "TRAINSCALE_JOB_END"
STOPPED = "stopped"
EXIT_STOPPED = 75  # EX_TEMPFAIL: stopped with a checkpoint, not finished
DEFAULT_WARNING = "USR1@120"
"""With --requeue or --chain and no --signal: SIGUSR1 two minutes before the time limit or a preemption."""


def continues(spec: SlurmJobSpec) -> bool:
    return bool(spec.requeue) or spec.chain > 1


def warning_signal(spec: SlurmJobSpec, handles_signal: bool = True) -> str | None:
    """``--signal``, else the default warning when the job continues and its target can act on it (a
    built-in workload or a script using trainscale: a plain script would just die of SIGUSR1)."""
    return spec.signal or (DEFAULT_WARNING if continues(spec) and handles_signal else None)


def signal_name(spec: SlurmJobSpec, handles_signal: bool = True) -> str | None:
    """``USR2@120`` / ``B:SIGUSR2@60`` -> ``SIGUSR2``: the signal the ranks' handler must catch."""
    sig = warning_signal(spec, handles_signal)
    if sig is None:
        return None
    name = sig.split("@")[0].split(":")[-1].upper()
    return name if name.startswith("SIG") or name.isdigit() else "SIG" + name


def exports(spec: SlurmJobSpec, handles_signal: bool = True) -> list[str]:
    out = []
    name = signal_name(spec, handles_signal)
    if name and name != "SIGUSR1":
        out.append(f"export {SIGNALS_VAR}={name}  # the ranks checkpoint on this signal (--signal)")
    if spec.chain > 1 and not spec.requeue:
        out.append(f"export {ON_SIGNAL_VAR}=stop  # link of a chain: on the signal, checkpoint and stop")
    if spec.requeue:
        out.append(f"export {MAX_REQUEUES_VAR}={spec.max_requeues}  # --max-requeues: after that, stop")
    if name:  # the ranks time their last save from measured ones to end before the limit (runtime/preemption.py)
        out.append(
            f'{JOB_END_VAR}=$(end=$(squeue -h -j "$SLURM_JOB_ID" -o %e 2>/dev/null) && [ -n "$end" ] && '
            'date -d "$end" +%s 2>/dev/null || true)'
        )
        out.append(f"export {JOB_END_VAR}  # the time limit: the last save is timed to end before it")
    return out


def start_lines(spec: SlurmJobSpec) -> list[str]:
    """At the top of the job: a link with nothing left to do, a job requeued past the cap."""
    out = []
    if spec.chain > 1:
        out += [
            "",
            f"# Chain of {spec.chain} jobs (afterany): the run's end is written to the run directory.",
            'if [ -f "$RUN_DIR/finished" ] || [ -f "$RUN_DIR/failed" ]; then',
            '  echo "trainscale: the run already ended ($(cat "$RUN_DIR"/finished "$RUN_DIR"/failed 2>/dev/null)); '
            'link $SLURM_JOB_ID has nothing to do"',
            "  exit 0",
            "fi",
        ]
    if spec.requeue:
        out += [
            "",
            f'if [ "${{SLURM_RESTART_COUNT:-0}}" -gt {spec.max_requeues} ]; then',
            f'  echo "trainscale: job $SLURM_JOB_ID was requeued ${{SLURM_RESTART_COUNT}} times, more than '
            f'--max-requeues {spec.max_requeues}: it stops here (resume: submit the run again, or use --chain)"',
            f"  exit {EXIT_STOPPED}",
            "fi",
        ]
    return out


def _cancel_others(why: str) -> list[str]:
    return [
        f'  echo "trainscale: {why}; cancelling the chain\'s other links"',
        '  for link in $(cat "$RUN_DIR/links" 2>/dev/null); do',
        '    [ "$link" = "$SLURM_JOB_ID" ] || scancel "$link" 2>/dev/null || true',
        "  done",
    ]


def end_lines(spec: SlurmJobSpec) -> list[str]:
    """After srun (``$status`` holds its exit code): requeue from the batch step, stop, finish, fail."""
    out = [
        # the marker goes first: a requeue ends this shell at once, and a marker left behind would requeue
        # the next attempt again when it ends
        'if [ -f "$JOB_DIR/requeue-requested" ]; then',
        '  target=$(cat "$JOB_DIR/requeue-requested"); rm -f "$JOB_DIR/requeue-requested"',
        '  echo "trainscale: requeueing $target from the batch step"',
        '  scontrol requeue "$target" || echo "trainscale: scontrol requeue $target failed; '
        'resume: submit the run again"',
        "fi",
        f'if [ -f "$JOB_DIR/{STOPPED}" ]; then',
    ]
    if spec.chain > 1:
        out += [
            f'  echo "trainscale: link $SLURM_JOB_ID stopped ($(cat "$JOB_DIR/{STOPPED}")); '
            "the next link of the chain resumes from the run's checkpoints\"",
            "  exit 0",
            "fi",
        ]
        out += ['if [ "$status" -eq 0 ]; then', '  echo "job $SLURM_JOB_ID" > "$RUN_DIR/finished"']
        out += _cancel_others("training finished in link $SLURM_JOB_ID")
        out += ["else", '  echo "job $SLURM_JOB_ID, exit code $status" > "$RUN_DIR/failed"']
        out += _cancel_others("link $SLURM_JOB_ID failed (exit code $status), which a next link would repeat")
        out += ["fi"]
    else:
        out += [
            f'  echo "trainscale: stopped: $(cat "$JOB_DIR/{STOPPED}"); the checkpoints are in the run '
            'directory $RUN_DIR"',
            f"  exit {EXIT_STOPPED}",
            "fi",
        ]
    if spec.sweep:
        out.append(
            'if [ "$status" -eq 0 ]; then date > "$TASK_DIR/finished"; '
            'else echo "exit code $status" > "$TASK_DIR/failed"; fi'
        )
    out.append('exit "$status"')
    return out


def preemptible(srun_line: str, spec: SlurmJobSpec, handles_signal: bool = True, ending: bool = True) -> list[str]:
    """Run the step in the background so this shell can pass a signal on, then (``ending``) decide how the job
    ends."""
    name = signal_name(spec, handles_signal) or "SIGUSR1"
    short = name.removeprefix("SIG")
    return [
        f"# Preemption: SLURM's warning signal ({name}) reaches the tasks (--signal); one sent to this batch shell",
        f"# (scancel --signal={short} --batch) is passed on through srun. The ranks checkpoint at the next step",
        "# boundary; rank 0 requeues the job or stops (chain link, requeue cap), as exported above.",
        f'trap \'echo "trainscale: batch shell got {name}, passing it to the ranks"; '
        f'kill -{short} "$SRUN_PID" 2>/dev/null || true\' {short}',
        srun_line + " &",
        "SRUN_PID=$!",
        "while true; do  # `wait` returns early when the trap runs: wait again until srun has ended",
        '  wait "$SRUN_PID" && status=0 || status=$?',
        '  kill -0 "$SRUN_PID" 2>/dev/null || break',
        "done",
        *(end_lines(spec) if ending else []),
    ]
