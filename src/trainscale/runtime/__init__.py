"""Process group, device, seeds and teardown, as one explicit Runtime object."""

from trainscale.runtime.runtime import Runtime, init

__all__ = ["Runtime", "init"]
