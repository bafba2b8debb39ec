"""The last module the forkserver of trainscale's own workers preloads (local.FORKSERVER_PRELOAD): what it has
loaded by now lives as long as the server, so it leaves the garbage collector's care (``gc.freeze``, which
Python's docs give for a process that forks without exec). Each forked worker's collections then skip torch's
~300,000 objects (a full one took 0.1 CPU-s, and a worker runs two as it ends) and leave their pages shared
with the server instead of copying them on write."""

import gc

gc.freeze()
