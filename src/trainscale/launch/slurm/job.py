"""From a linted plan to a submitted job whose record ``trainscale logs`` can find.

Shared by ``trainscale slurm --submit`` and ``trainscale bench --slurm`` (one job per configuration).
"""

from __future__ import annotations

import time

from trainscale.errors import ConfigError
from trainscale.launch.slurm.jobdir import JobRecord, new_script_path, save_record
from trainscale.launch.slurm.lint import errors, lint
from trainscale.launch.slurm.queue import Runner
from trainscale.launch.slurm.render import render
from trainscale.launch.slurm.spec import JobPlan, SlurmJobSpec, resolve
from trainscale.launch.slurm.submit import submit, write_script
from trainscale.profiles.schema import ClusterProfile


def checked_plan(spec: SlurmJobSpec, profile: ClusterProfile, *, preflight=None, what: str = "") -> JobPlan:
    """Resolve and lint; the first error becomes a ConfigError (``what`` says which job, for a study)."""
    plan = resolve(spec, profile)
    bad = errors(lint(spec, profile, plan, preflight=preflight))
    if bad:
        first = bad[0]
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise ConfigError(f"{what}{first.message}{more}", hint=first.hint or "see `trainscale slurm --dry-run`")
    return plan


def submit_job(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan, *, run: Runner | None = None) -> JobRecord:
    """Write the script (never over an existing file), ``sbatch --parsable`` it and save the job's record."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    script = write_script(render(spec, profile, plan), new_script_path(plan.output_dir, spec.name, stamp))
    sub = submit(script, run=run)
    record = JobRecord(job_id=sub.job_id, cluster=sub.cluster, name=spec.name, launcher=plan.launcher,
                       profile=profile.name, script=str(script), output_dir=str(plan.output_dir),
                       world_size=plan.world_size, ranks_per_node=plan.ranks_per_node,
                       command=" ".join(spec.command_line), submitted_at=time.time())
    save_record(record)
    return record
