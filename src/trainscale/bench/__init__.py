"""Scaling studies: run one workload at several configurations and explain how it scales.

    spec = StudySpec(workload="cnn", configs="1,2", epochs=2)
    outcome = run_study(spec)                   # plan (errors first) -> launch each -> compare -> files
    print(outcome.files["md"])

Pieces: configs (tokens, batches), study (spec, plan), runner (launch, records), results (speedup,
JSON/CSV/Markdown), plots, allreduce (bus bandwidth), plan* (the one model: `trainscale plan`, and each study's
plan against its measurements).
"""

import importlib

_EXPORTS = {"Outcome": "session", "run_study": "session", "StudySpec": "study", "plan": "study"}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    """Imported when first used: `trainscale report` reads a study through bench's pure modules (plots,
    results) and must not pay for the launcher's torch imports of bench.session."""
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
