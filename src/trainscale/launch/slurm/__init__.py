"""SLURM as spec -> render -> lint -> submit -> watch.

spec = SlurmJobSpec(workload="cnn", args=("--max-steps", "20"), profile="local-test", nodes=2,
                    gpus_per_node=2, time="00:10:00", launcher="srun")
profile = load_profile(spec.profile)
findings = lint(spec, profile)          # errors stop the submission
text = render(spec, profile)            # pure: the batch script
sub = submit(write_script(text, path))  # sbatch --parsable
info = watch(sub.job_id)                # until a final state; explain(info, record) says what happened
"""

from trainscale.launch.slurm.jobdir import JobRecord, load_record, rank_log_text, save_record, state_dir
from trainscale.launch.slurm.lint import Finding, lint
from trainscale.launch.slurm.queue import JobInfo, job_info, squeue
from trainscale.launch.slurm.render import render
from trainscale.launch.slurm.spec import JobPlan, SlurmJobSpec, resolve
from trainscale.launch.slurm.submit import Submission, cancel, submit, write_script
from trainscale.launch.slurm.watch import explain, watch

__all__ = [
    "Finding",
    "JobInfo",
    "JobPlan",
    "JobRecord",
    "SlurmJobSpec",
    "Submission",
    "cancel",
    "explain",
    "job_info",
    "lint",
    "load_record",
    "rank_log_text",
    "render",
    "resolve",
    "save_record",
    "squeue",
    "state_dir",
    "submit",
    "watch",
    "write_script",
]
