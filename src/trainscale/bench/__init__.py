"""Scaling studies: run one workload at several configurations and explain how it scales.

    spec = StudySpec(workload="cnn", configs="1,2", epochs=2)
    outcome = run_study(spec)                   # plan (errors first) -> launch each -> compare -> files
    print(outcome.files["md"])

Pieces: configs (tokens, batches), study (spec, plan), runner (launch, records), results (speedup,
JSON/CSV/Markdown), plots, allreduce (busbw), projection (pure model), predictions (model vs measured).
"""

from trainscale.bench.session import Outcome, ProjectionRequest, run_study
from trainscale.bench.study import StudySpec, plan

__all__ = ["Outcome", "ProjectionRequest", "StudySpec", "plan", "run_study"]
