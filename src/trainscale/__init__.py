"""trainscale: one PyTorch training script from a laptop CPU to many SLURM nodes."""

from trainscale._version import __version__
from trainscale.errors import CheckpointError, ConfigError, LaunchError, TrainscaleError

__all__ = [
    "__version__",
    "init",
    "Runtime",
    "TrainscaleError",
    "ConfigError",
    "LaunchError",
    "CheckpointError",
]


def __getattr__(name: str):
    # Lazy: `import trainscale` stays cheap (no torch import) for the CLI and env detection.
    if name in ("init", "Runtime"):
        from trainscale import runtime

        return getattr(runtime, name)
    raise AttributeError(f"module 'trainscale' has no attribute {name!r}")
