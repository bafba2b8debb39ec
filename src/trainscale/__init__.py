"""trainscale: one PyTorch training script from a laptop CPU to many SLURM nodes."""

import importlib

from trainscale._version import __version__
from trainscale.errors import CheckpointError, ConfigError, LaunchError, RankFailed, TrainscaleError

__all__ = [
    "__version__",
    "init",
    "launch",
    "slurm",
    "Runtime",
    "TrainscaleError",
    "ConfigError",
    "LaunchError",
    "CheckpointError",
    "RankFailed",
]


def __getattr__(name: str):
    # Lazy: `import trainscale` stays cheap (no torch import) for the CLI and env detection.
    if name == "init":  # a Runtime that also sets models up for a strategy (train/session.py)
        from trainscale.train.session import init  # noqa: PLC0415 (job kit)

        return init
    if name in ("launch", "slurm"):  # trainscale.launch(fn, ...) (a callable package), trainscale.slurm.submit(...)
        return importlib.import_module(f"trainscale.{name}")
    if name == "Runtime":
        from trainscale.runtime import Runtime  # noqa: PLC0415 (job kit)

        return Runtime
    raise AttributeError(f"module 'trainscale' has no attribute {name!r}")
