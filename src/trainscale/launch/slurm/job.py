"""From a linted plan to a submitted job whose record ``trainscale jobs JOB`` can find.

Shared by ``trainscale slurm --submit``, ``trainscale sweep`` and ``trainscale bench --slurm``. A
submission makes its run directory (launch/slurm/layout.py) first: the batch script, a copy of the
user's project the job runs (launch/slurm/snapshot.py: later edits never reach a queued job),
``submission.json`` (command, resolved spec, versions, git commit, what was snapshotted); then
``sbatch`` once, or N times linked ``afterany`` for a chain.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainscale.errors import ConfigError
from trainscale.launch.kit import write_kit
from trainscale.launch.rundir import versions
from trainscale.launch.slurm import cluster
from trainscale.launch.slurm.jobdir import JobRecord, save_record
from trainscale.launch.slurm.layout import check_snapshot, target_in_run
from trainscale.launch.slurm.lint import ERROR, NOTE, Finding, errors, lint
from trainscale.launch.slurm.queue import Runner
from trainscale.launch.slurm.render import batch_output_pattern, render
from trainscale.launch.slurm.snapshot import Manifest, list_snapshot, over_limit_message, write_snapshot
from trainscale.launch.slurm.spec import JobPlan, SlurmJobSpec, resolve
from trainscale.launch.slurm.submit import submit, write_script
from trainscale.launch.slurm.toolchain import job_python
from trainscale.profiles.schema import ClusterProfile


def refuse_errors(findings: list[Finding], what: str = "") -> None:
    """The first error among ``findings`` as a ConfigError (``what`` says which job, for a study)."""
    bad = errors(findings)
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise ConfigError(f"{what}{bad[0].message}{more}", hint=bad[0].hint or "see `trainscale slurm --dry-run`")


def checked_plan(spec: SlurmJobSpec, profile: ClusterProfile, *, preflight=None, what: str = "") -> JobPlan:
    """Resolve and lint; the first error becomes a ConfigError."""
    plan = resolve(spec, profile)
    refuse_errors(lint(spec, profile, plan, preflight=preflight), what)
    return plan


def _fresh_run_dir(plan: JobPlan) -> JobPlan:
    """A run directory nobody has used: a second submission within the same second gets ``-2``."""
    run_dir, n = plan.run_dir, 2
    while run_dir.exists():
        run_dir = plan.run_dir.with_name(f"{plan.run_dir.name}-{n}")
        n += 1
    return dataclasses.replace(plan, run_dir=run_dir)


def git_state(path: Path) -> dict[str, Any] | None:
    """The commit (and whether the tree had uncommitted changes) of the repository holding ``path``."""
    git = shutil.which("git")
    if not git:
        return None
    where = path if path.is_dir() else path.parent
    try:
        head = subprocess.run([git, "-C", str(where), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            [git, "-C", str(where), "status", "--porcelain"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(dirty.stdout.strip())}


def submission_record(
    spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan, snapshot: dict[str, Any] | None = None
) -> dict[str, Any]:
    code = plan.code_root or spec.script
    python = job_python(spec, profile)
    return {
        "command": list(spec.command_line),
        "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "user": os.environ.get("USER", ""),
        "cwd": os.getcwd(),
        "spec": dataclasses.asdict(spec),  # its paths written as strings (json.dumps's default=str)
        "profile": profile.name,
        "plan": {
            "launcher": plan.launcher,
            "nodes": plan.nodes,
            "ranks_per_node": plan.ranks_per_node,
            "world_size": plan.world_size,
            "cpus_per_rank": plan.cpus_per_rank,
            "time_s": plan.time_s,
        },
        "versions": versions(),
        "python": {"command": python.command, "source": python.source, "job_kit": python.kit},
        "git": git_state(Path(code).absolute()) if code else None,
        "snapshot": snapshot,
    }


def snapshot_listing(plan: JobPlan) -> Manifest | None:
    """What the job's snapshot will hold (nothing is written); None when the job copies no code."""
    return None if plan.code_root is None else list_snapshot(plan.code_root, exclude=[plan.output_dir])


def snapshot_findings(spec: SlurmJobSpec, plan: JobPlan) -> list[Finding]:
    """What the job's code will be (a note), or an error when the snapshot is above the limits."""
    manifest = snapshot_listing(plan)
    if manifest is None:
        return []
    if manifest.over_limit:
        return [Finding(ERROR, *over_limit_message(manifest))]
    what = (
        str(Path(spec.script).absolute().relative_to(manifest.root))
        if spec.script and manifest.root in Path(spec.script).absolute().parents
        else spec.module or spec.script
    )
    found = [
        Finding(
            NOTE,
            f"the job runs {what} from a snapshot of {manifest.root} taken at submission: {manifest.describe()}",
            "--snapshot DIR snapshots another directory; what is left out or linked: docs/slurm.md#the-code-a-job-runs",
        )
    ]
    read_live = [arg for arg in spec.args if _live_file(arg)]
    if read_live:  # nanoGPT's `train.py config/train_gpt2.py`: exec'd by a path from the working directory
        found.append(
            Finding(
                NOTE,
                f"the job reads {', '.join(read_live[:3])} from {Path.cwd()} when it runs, not "
                "from the snapshot (its working directory is the one you submit from): an edit before "
                "the job starts reaches it",
                "to freeze it too, pass its path in the snapshot, or a copy of it",
            )
        )
    return found


_CODE_SUFFIXES = (".py", ".yaml", ".yml", ".toml", ".cfg", ".ini", ".json")


def _live_file(arg: str) -> bool:
    """A script argument naming, relative to the working directory, a code or config file that exists here."""
    path = Path(arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg)
    return not path.is_absolute() and path.suffix in _CODE_SUFFIXES and path.is_file()


def take_snapshot(spec: SlurmJobSpec, plan: JobPlan) -> dict[str, Any] | None:
    """Copy the job's code into the run; the record of what was copied (for submission.json)."""
    manifest = snapshot_listing(plan)
    if manifest is None:
        return None
    target = target_in_run(spec.script, spec.snapshot, plan.code_root, plan.run_dir)
    sha256 = write_snapshot(manifest, Path(target.snapshot or ""))
    return {
        "root": str(manifest.root),
        "copy": target.snapshot,
        "mode": manifest.mode,
        "files": len(manifest.files),
        "bytes": manifest.bytes,
        "sha256": sha256,
        "linked": list(manifest.links),
        "script": str(Path(spec.script).absolute().relative_to(manifest.root)) if spec.script else None,
    }


def make_jobs_folder(jobs: Path) -> bool:
    """Make the folder of jobs (``trainscale-jobs``) when it is missing, with a ``.gitignore`` of ``*`` in it, as a
    virtualenv does: what trainscale writes there is no source to commit. Whether it was made."""
    try:
        jobs.mkdir(parents=True)
    except FileExistsError:  # there already (or made by a submission beside this one): not ours to remove
        return False
    (jobs / ".gitignore").write_text("# made by trainscale: the files of its jobs\n*\n")
    return True


def prepare_run(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan) -> Path:
    """Make the run directory ``plan.run_dir`` (a fresh one): the code the job will run, submission.json, the
    batch script. Returns the script."""
    plan.run_dir.mkdir(parents=True)
    snapshot = take_snapshot(spec, plan)
    for pattern in (spec.output, spec.error):  # slurmd opens them before the script runs: their directory must exist
        if pattern and "%" not in str(Path(pattern).parent):
            Path(pattern).parent.mkdir(parents=True, exist_ok=True)
    kit = None
    if job_python(spec, profile).kit:  # a stock image's or a module's Python gets trainscale's worker side here
        kit = write_kit(plan.output_dir)
    record = submission_record(spec, profile, plan, snapshot)
    (plan.run_dir / "submission.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    return write_script(render(spec, profile, plan, kit_dir=kit), plan.run_dir / "job.sbatch")


def job_record(
    spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan, script: Path, sub: Any, *, chain_link: int = 0
) -> JobRecord:
    """What trainscale keeps of a submitted job (``trainscale jobs`` reads it)."""
    return JobRecord(
        job_id=sub.job_id,
        cluster=sub.cluster,
        name=spec.name,
        launcher=plan.launcher,
        profile=profile.name,
        script=str(script),
        output_dir=str(plan.output_dir),
        world_size=plan.world_size,
        ranks_per_node=plan.ranks_per_node,
        command=" ".join(spec.command_line),
        submitted_at=time.time(),
        batch_output_pattern=batch_output_pattern(spec, plan),
        run_dir=str(plan.run_dir),
        chain_link=chain_link,
    )


def submit_job(
    spec: SlurmJobSpec,
    profile: ClusterProfile,
    plan: JobPlan,
    *,
    run: Runner | None = None,
    before_submit: Callable[[JobPlan], None] | None = None,
) -> JobRecord:
    """Prepare the run, ``sbatch --parsable`` it (``--chain N``: N times, each after the one before) and save
    the records; returns the first job's. ``before_submit(plan)`` writes what the job reads into its run
    directory before sbatch (``trainscale.slurm``'s pickled call). Every way in (``trainscale slurm``, ``sweep``,
    ``bench --slurm``, ``trainscale.slurm``) meets the partition's real sizes here (``sinfo``: more nodes, CPUs
    or memory than it has is refused before anything is written); a test's fake ``run`` has no partitions."""
    if run is None:
        refuse_errors(cluster.findings(plan, profile, cluster.partitions())[0])
    check_snapshot(spec.snapshot, spec.script)
    plan = _fresh_run_dir(plan)
    jobs = plan.run_dir.parent
    records: list[JobRecord] = []
    made = make_jobs_folder(jobs)
    try:
        script = prepare_run(spec, profile, plan)
        if before_submit is not None:
            before_submit(plan)
        for link in range(spec.chain):
            extra = (f"--dependency=afterany:{records[-1].job_id}",) if records else ()
            records.append(
                job_record(
                    spec,
                    profile,
                    plan,
                    script,
                    submit(script, run=run, extra=extra),
                    chain_link=link + 1 if spec.chain > 1 else 0,
                )
            )
            if spec.chain > 1:  # the links file is what each link reads to cancel the others
                (plan.run_dir / "links").write_text("".join(f"{r.job_id}\n" for r in records))
    except BaseException:
        if not records:  # nothing was submitted (sbatch refused it, or it was never asked): nothing half-made stays
            shutil.rmtree(jobs if made else plan.run_dir, ignore_errors=True)
        raise
    finally:
        if records:
            from trainscale.launch.rundir import mark_latest  # noqa: PLC0415 (optional dependency)

            mark_latest(plan.run_dir)  # trainscale-jobs/latest
            for record in records:
                save_record(record)
    return records[0]
