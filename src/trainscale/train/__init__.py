"""Training: the loop every built-in workload runs (loop.py), its options (options.py),
its results (metrics.py), and the simple path a script uses (session.py).

Built on strategies/, checkpoint/ and data/; used by workloads/ and by ``trainscale.init()``.
"""

from trainscale.train.loop import Loop, Task
from trainscale.train.options import TrainOptions, parse
from trainscale.train.session import Session, init

__all__ = ["Loop", "Task", "TrainOptions", "parse", "Session", "init"]
