"""Experiment trackers behind one call: ``rt.log({"loss": ...}, step=...)`` writes to every tracker chosen
(``--tracker tensorboard,wandb,mlflow,csv``, ``[train] trackers``, ``trainscale.init(trackers=...)``), rank 0
alone, all into the run's directory (``tensorboard/``, ``wandb/``, ``mlruns/``, ``metrics.csv``, and
``trackers.json``: the run ids a restart continues), offline. What each writes and how to view it:
docs/ecosystem.md, "One metrics call, every tracker". Each tracker's package is an optional extra; a
missing one is refused when the options are read, before anything is launched.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import sys
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from trainscale.errors import ConfigError, did_you_mean

TRACKERS = ("tensorboard", "wandb", "mlflow", "csv")
STATE_FILE = "trackers.json"
FILE_STORE_VAR = "MLFLOW_ALLOW_FILE_STORE"


PACKAGES = {"mlflow": "mlflow-skinny"}
"""The pip package of a tracker whose import name differs (MLflow's skinny client has the local file store)."""


def parse_trackers(value: str | Iterable[str] | None) -> tuple[str, ...]:
    """``"tensorboard,csv"`` or ``["tensorboard", "csv"]`` -> ``("tensorboard", "csv")``, each known and
    its package installed."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    names = tuple(dict.fromkeys(n.strip().lower() for n in items if n.strip()))
    for name in names:
        if name not in TRACKERS:
            raise ConfigError(
                f"tracker {name!r} unknown: trainscale writes to tensorboard, wandb, mlflow and csv",
                hint=did_you_mean(name, TRACKERS),
            )
        if name != "csv" and importlib.util.find_spec(name) is None:  # each other tracker imports its namesake
            raise ConfigError(
                f"tracker {name} needs the {name} package, which is not installed here",
                hint=f"pip install {PACKAGES.get(name, name)}, or leave {name} out of the trackers",
            )
    return names


class _TensorBoard:
    name = "tensorboard"

    def __init__(self, directory: Path, state: dict) -> None:
        from torch.utils.tensorboard import SummaryWriter  # noqa: PLC0415 (optional dependency)

        self.path = directory / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.path))

    def describe(self) -> str:
        return f"tensorboard {self.path} (view: tensorboard --logdir {self.path})"

    def log(self, values: Mapping[str, float], step: int, at: float) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step, walltime=at)

    def hyperparameters(self, config: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard.summary import hparams  # noqa: PLC0415 (optional dependency)

        for summary in hparams(dict(config), {}):  # into this run's own file: TensorBoard's HPARAMS tab
            self.writer.file_writer.add_summary(summary)

    def close(self) -> None:
        self.writer.close()


class _Wandb:
    name = "wandb"

    def __init__(self, directory: Path, state: dict) -> None:
        import wandb  # noqa: PLC0415 (optional dependency)

        # Offline unless the user's environment chose a mode: ranks on compute nodes usually have no network.
        self.mode = os.environ.get("WANDB_MODE", "offline")
        state.setdefault("wandb_id", uuid.uuid4().hex[:12])
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "trainscale"),
            name=state["name"],
            id=state["wandb_id"],
            dir=str(directory),
            mode=self.mode,
            resume="allow",
            settings=wandb.Settings(console="off", silent=True),
        )
        self.path = Path(self.run.dir).parent if self.run.dir else directory / "wandb"

    def describe(self) -> str:
        if self.mode == "offline":
            return f"wandb offline {self.path} (upload: wandb sync {self.path})"
        return f"wandb {self.mode} run {self.run.id} (files {self.path})"

    def log(self, values: Mapping[str, float], step: int, at: float) -> None:
        self.run.log(dict(values), step=step)  # W&B stamps the time itself: no API takes another

    def hyperparameters(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def close(self) -> None:
        self.run.finish()


class _MLflow:
    name = "mlflow"

    def __init__(self, directory: Path, state: dict) -> None:
        from mlflow.tracking import MlflowClient  # noqa: PLC0415 (optional dependency)

        self.uri = os.environ.get("MLFLOW_TRACKING_URI") or (directory / "mlruns").absolute().as_uri()
        if self.uri.startswith("file:"):
            # MLflow 3 refuses its file store unless told it is wanted: a local store needs no server
            # and no database, which is what a compute node without a network can have.
            os.environ.setdefault(FILE_STORE_VAR, "true")
        self.client = MlflowClient(self.uri)
        name = os.environ.get("MLFLOW_EXPERIMENT_NAME", "trainscale")
        found = self.client.get_experiment_by_name(name)
        experiment = found.experiment_id if found is not None else self.client.create_experiment(name)
        run_id = state.get("mlflow_run_id")
        if run_id is None or self._gone(run_id):
            run_id = self.client.create_run(experiment, run_name=state["name"]).info.run_id
        else:
            self.client.update_run(run_id, status="RUNNING")
        state["mlflow_run_id"] = self.run_id = run_id

    def _gone(self, run_id: str) -> bool:
        try:
            self.client.get_run(run_id)
            return False
        except Exception:  # MLflow raises its own error for a run that store does not hold
            return True

    def describe(self) -> str:
        view = (
            f"{FILE_STORE_VAR}=true mlflow ui --backend-store-uri {self.uri}"
            if self.uri.startswith("file:")
            else f"run {self.run_id}"
        )
        return f"mlflow {self.uri} (view: {view})"

    def log(self, values: Mapping[str, float], step: int, at: float) -> None:
        from mlflow.entities import Metric  # noqa: PLC0415 (optional dependency)

        stamp = int(at * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(_mlflow_key(k), v, stamp, step) for k, v in values.items()])

    def hyperparameters(self, config: Mapping[str, Any]) -> None:
        from mlflow.entities import Param  # noqa: PLC0415 (optional dependency)

        have = self.client.get_run(self.run_id).data.params  # a resumed run's: MLflow refuses to change a param
        params = [Param(_mlflow_key(k), str(v)[:6000]) for k, v in config.items() if _mlflow_key(k) not in have]
        for at in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.run_id, params=params[at : at + 100])

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


def _mlflow_key(key: str) -> str:
    """MLflow's metric names allow letters, digits, ``_ - . / :`` and spaces; anything else becomes ``_``."""
    return "".join(c if c.isalnum() or c in "_-./: " else "_" for c in key)


class _Csv:
    name = "csv"

    def __init__(self, directory: Path, state: dict) -> None:
        self.path = directory / "metrics.csv"
        new = not self.path.exists()
        self.file = self.path.open("a", newline="")  # a restarted run appends to the same file
        self.writer = csv.writer(self.file)
        if new:
            self.writer.writerow(["step", "key", "value", "time"])

    def describe(self) -> str:
        return f"csv {self.path}"

    def log(self, values: Mapping[str, float], step: int, at: float) -> None:
        self.writer.writerows([step, k, repr(v), round(at, 3)] for k, v in values.items())
        self.file.flush()

    def hyperparameters(self, config: Mapping[str, Any]) -> None:
        (self.path.parent / "hyperparameters.json").write_text(json.dumps(dict(config), indent=2, default=str) + "\n")

    def close(self) -> None:
        self.file.close()


_BACKENDS = {"tensorboard": _TensorBoard, "wandb": _Wandb, "mlflow": _MLflow, "csv": _Csv}


class Trackers:
    """The chosen trackers, opened in ``directory`` (rank 0 only: the caller decides who opens them).

    ``name``: the run's name in W&B and MLflow (default: the directory's name); ``run_id``: the W&B run
    id for a new directory (an experiment's own id, so two directories of the same name never resume
    each other's runs)."""

    def __init__(
        self,
        names: Iterable[str],
        directory: str | os.PathLike,
        *,
        name: str | None = None,
        run_id: str | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> None:
        self.names = parse_trackers(list(names))
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        state_path = self.directory / STATE_FILE
        self.state: dict[str, Any] = json.loads(state_path.read_text()) if state_path.exists() else {}
        self.state.setdefault("name", name or self.directory.absolute().name)
        if run_id:
            self.state.setdefault("wandb_id", run_id)
        self.backends: list[Any] = []
        try:
            for tracker in self.names:
                self.backends.append(_BACKENDS[tracker](self.directory, self.state))
            if config:  # the run's configuration, each tracker's own way (Accelerate's init_trackers(config=...))
                flat = hyperparameters(config)
                for backend in self.backends:
                    try:
                        backend.hyperparameters(flat)
                    except Exception as exc:  # the run's curves matter more than its configuration's copy
                        print(
                            f"trainscale: {backend.name}: the hyperparameters were not logged: "
                            f"{type(exc).__name__}: {exc}",
                            file=sys.stderr,
                            flush=True,
                        )
        except BaseException:
            self.close()
            raise
        state_path.write_text(json.dumps(self.state, indent=2) + "\n")

    def describe(self) -> str:
        """Where each tracker writes, with the command that shows it."""
        return "; ".join(b.describe() for b in self.backends)

    def log(self, values: Mapping[str, Any], step: int, at: float | None = None) -> None:
        """``at``: when the values were measured (seconds since the epoch; default now): values read back
        together, a whole epoch's losses at its end, keep each step's own time."""
        numbers = {str(k): _number(k, v) for k, v in values.items()}
        at = time.time() if at is None else at
        for backend in self.backends:
            backend.log(numbers, step, at)

    def close(self) -> None:
        backends, self.backends = self.backends, []
        for backend in backends:
            backend.close()


def hyperparameters(config: Mapping[str, Any]) -> dict[str, Any]:
    """A run's configuration as the trackers take it: nested tables flattened to ``a/b`` keys, values that are
    not a number, a bool or a string written as text (a tuple of trackers, a path, None)."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            flat.update({f"{key}/{k}": v for k, v in hyperparameters(value).items()})
        else:
            flat[str(key)] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return flat


def command_options(argv: Iterable[str]) -> dict[str, Any]:
    """A script's argparse-style options as hyperparameters of their own, named as argparse names them:
    ``--lr 0.1`` or ``--lr=0.1`` -> ``lr=0.1``, ``--batch-size 32`` -> ``batch_size=32``, a flag without a
    value -> ``True``; numbers as numbers. Positional arguments and short options stay in the command line."""
    args, out = list(argv), {}
    for i, arg in enumerate(args):
        if arg == "--":
            break
        if not arg.startswith("--") or len(arg) == 2:
            continue
        key, eq, value = arg[2:].partition("=")
        nxt = args[i + 1] if i + 1 < len(args) else None
        if not eq:
            value = nxt if nxt is not None and (not nxt.startswith("-") or _is_number(nxt)) else True
        out[key.replace("-", "_")] = (
            value
            if value is True or not _is_number(value)
            else int(value)
            if value.lstrip("+-").isdigit()
            else float(value)
        )
    return out


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _number(key: Any, value: Any) -> float:
    """A float from a number, a bool or a one-element tensor (read back here, on rank 0)."""
    try:
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        raise ConfigError(
            f"rt.log: {key!r} is {type(value).__name__} {str(value)[:40]!r}, not a number",
            hint="log scalars: numbers or one-element tensors, e.g. rt.log({'loss': loss.item()})",
        ) from None
    return number
