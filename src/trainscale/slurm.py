"""``trainscale.slurm``: submit a function or a script to SLURM from Python and await it.

    job = trainscale.slurm.submit(train, 1e-3, profile="lumi", account="project_465000000", nodes=2, time="01:00:00")
    print(job.result())                                      # rank 0's return value

The same path as ``trainscale slurm --submit`` (launch/slurm/api.py has the details).
"""

from trainscale.errors import RankFailed
from trainscale.launch.slurm.api import Executor, map_array, submit
from trainscale.launch.slurm.future import Job

__all__ = ["Executor", "Job", "RankFailed", "map_array", "submit"]
