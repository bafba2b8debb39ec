"""The module the forkserver of trainscale's own workers preloads (local.FORKSERVER_PRELOAD): torch, and
torch._dynamo, which any optimizer imports on first use (together ~2.3 CPU-seconds a process, less 0.3 with
the collector paused: bootstrap.collector_paused), DCP for sharded checkpoints.

What the server has loaded by now lives as long as it does, so it leaves the garbage collector's care
(``gc.freeze``, which Python's docs give for a process that forks without exec): each forked worker's
collections then skip torch's ~300,000 objects (a full one took 0.1 CPU-s, and a worker runs two as it
ends) and leave their pages shared with the server instead of copying them on write.

The signals srun and a terminal send to every process (bootstrap.FORKSERVER_BLOCKS) stay blocked here, as
they were while the launcher started the server (local.start_forkserver): the server must not die of one,
its workers would die with it. A server that multiprocessing starts again by itself is covered from here on.
"""

import gc
import signal

from trainscale.launch.bootstrap import FORKSERVER_BLOCKS, collector_paused, cuda_driver_initialised

signal.pthread_sigmask(signal.SIG_BLOCK, FORKSERVER_BLOCKS)
with collector_paused():
    import torch  # noqa: F401
    import torch._dynamo  # noqa: F401
    import torch.distributed  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401
CUDA_DRIVER_INITIALISED = cuda_driver_initialised()  # by any library, not only torch: the workers refuse to start
gc.freeze()
