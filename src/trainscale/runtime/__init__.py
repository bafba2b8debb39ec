"""Process group, device, seeds and teardown, as one explicit Runtime object."""

__all__ = ["Runtime", "init"]


def __getattr__(name: str):
    # Lazy: the heartbeat (runtime/hangwatch/heartbeat.py), which every worker loads when its script imports torch, and
    # the job kit's copy of it need none of the Runtime's own modules.
    if name in __all__:
        from trainscale.runtime import runtime  # noqa: PLC0415 (job kit)

        return getattr(runtime, name)
    raise AttributeError(f"module 'trainscale.runtime' has no attribute {name!r}")
