"""One run, one directory: where `trainscale run` keeps a run's records, every attempt's per-rank logs,
its checkpoints (when the run makes them and no other place was given) and what ran
(``<log dir>/<label>-<YYYYmmdd-HHMMSS>[-k]/``, and ``<log dir>/latest``; its contents: docs/launch.md, the
table's "log directory" row, and ``trainscale report`` writes ``report/`` into it).

torch's agent names its log directory ``<log dir>/<run id>_<random>/``, one per agent; trainscale
hands it :class:`RunLogsSpecs`, which writes the attempts into the run directory itself. ``--log-dir``
keeps torchrun's meaning: the directory the run directories go in (seed 003's ``--log-dir ../logs``).
A run whose records already have a home (``TRAINSCALE_RUN_DIR``: a SLURM job's run directory, a
sweep's task) keeps its records there, with a run.json where nothing says what ran; its logs still get
a directory here, one per node of a multi-node run (named after the node). A caller may name the run
directory itself (bench: ``runs/<NN>-<config>/`` of its study).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import platform
import socket
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from trainscale._version import __version__
from trainscale.env import node_name

DEFAULT_ROOT = Path("trainscale-runs")
RUN_RECORD = "run.json"
WORKLOADS_MODULE = "trainscale.workloads"


def logs_specs(run_dir: Path, *, redirects: str, tee: str, local_ranks_filter: str) -> Any:
    """The run's logs spec from torchrun's logging options, as torch's ``config_from_args`` reads them:
    torch's per-attempt, per-rank log files (``DefaultLogsSpecs``), written into the run directory itself
    instead of a fresh ``<run id>_<random>`` directory beside it. torch is imported here, by the launcher
    that has it loaded already: the rest of this module serves commands that never load torch (a submission)."""
    from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, Std  # noqa: PLC0415 (torch-free module)

    class RunLogsSpecs(DefaultLogsSpecs):
        def _make_log_dir(self, log_dir: str | None, rdzv_run_id: str) -> str:
            # DefaultLogsSpecs calls this once, at the first attempt, for the directory its attempts go in
            # (tests/unit/test_run_dir.py holds torch to it)
            os.makedirs(str(log_dir), exist_ok=True)
            return str(log_dir)

    ranks = {int(r) for r in local_ranks_filter.split(",")} if local_ranks_filter else None
    return RunLogsSpecs(
        log_dir=str(run_dir), redirects=Std.from_str(redirects), tee=Std.from_str(tee), local_ranks_filter=ranks
    )


def label(target: str, args: tuple[str, ...], *, module: bool) -> str:
    """A run's name before its time stamp: the workload's name, the script's or program's stem, the module."""
    if module and target == WORKLOADS_MODULE and args:
        return args[0]
    if module:
        return target.rsplit(".", 1)[-1]
    return Path(target).stem or "run"


LATEST = "latest"


def mark_latest(directory: Path) -> None:
    """``<parent>/latest`` -> ``directory``, so the next command names the newest run, study or job
    without its date (``trainscale report trainscale-runs/latest``). Replaced only while it is a link:
    a file or directory of the user's named ``latest`` is left alone. Best effort: no link, no harm."""
    directory = Path(directory)
    link = directory.parent / LATEST
    if link.exists() and not link.is_symlink():
        return
    tmp = directory.parent / f".{LATEST}.{os.getpid()}"
    try:
        tmp.unlink(missing_ok=True)
        os.symlink(directory.name, tmp)
        os.replace(tmp, link)
    except OSError:
        tmp.unlink(missing_ok=True)


def create(root: Path, name: str, *, multinode: bool = False, now: datetime.datetime | None = None) -> Path:
    """A new run directory under ``root``: ``<name>-<stamp>``, ``-2``, ``-3``... when taken (made with an
    exclusive mkdir, so two runs started in the same second never share one). Each node of a multi-node
    run makes its own, named after its host."""
    stamp = (now or datetime.datetime.now()).strftime("%Y%m%d-%H%M%S")
    host = node_name()
    base = f"{name}-{stamp}" + (f"-{host}" if multinode else "")
    try:
        root.mkdir(parents=True)
        (root / ".gitignore").write_text("*\n")  # as a virtualenv: runs are never the user's sources
    except FileExistsError:
        pass
    for k in range(1, 1000):
        candidate = root / (base if k == 1 else f"{base}-{k}")
        try:
            candidate.mkdir()
        except FileExistsError:
            continue
        mark_latest(candidate)
        return candidate
    raise FileExistsError(f"{root}: no free run directory name for {base}")


OWN_CHECKPOINTS = {"gpt": "--experiment-dir", "hf-finetune": "--output-dir"}
"""Built-in workloads whose checkpoints live in a directory of their own, and the option that names it."""


def checkpoint_args(
    target: str, args: tuple[str, ...], *, module: bool, max_restarts: int, run_dir: Path
) -> tuple[str, ...]:
    """A built-in workload restarted by the agent resumes from its checkpoints: with ``--max-restarts k > 0``
    and no ``--checkpoint-dir`` they go into the run directory (as a SLURM job's go into its run directory).
    A run without restarts makes no checkpoints unless asked: a later run never resumes a finished one.
    gpt and hf-finetune keep theirs in their own directory (OWN_CHECKPOINTS), where a later run of the
    same command looks for them: left alone."""
    if not (module and target == WORKLOADS_MODULE) or max_restarts <= 0 or (args[:1] and args[0] in OWN_CHECKPOINTS):
        return args
    if any(a == "--checkpoint-dir" or a.startswith("--checkpoint-dir=") for a in args):
        return args
    return (*args, "--checkpoint-dir", str(run_dir / "checkpoints"))


def versions() -> dict[str, str | None]:
    """trainscale's, torch's and Python's versions here; torch's without importing it where it is not loaded."""
    torch = sys.modules.get("torch")
    try:
        torch_version = torch.__version__ if torch else metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    return {"trainscale": __version__, "torch": torch_version, "python": platform.python_version()}


def write_record(run_dir: Path, **fields: Any) -> Path:
    """``run.json``: merged with what is there (the start writes what ran, the end adds the outcome)."""
    path = run_dir / RUN_RECORD
    run_dir.mkdir(parents=True, exist_ok=True)  # a TRAINSCALE_RUN_DIR of the user's may not exist yet
    try:
        record = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        record = {}
    record.update(fields)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
    os.replace(tmp, path)
    return path


def describes_itself(records: Path) -> bool:
    """True where the records' directory has no word on what ran yet (no run.json, no submission.json)."""
    return not (records / RUN_RECORD).exists() and not (records / "submission.json").exists()


def end_record(logs: Path, records: Path, *, ok: bool, seconds: float, summary: str = "") -> None:
    """The outcome, in each run.json this launch started; a failed run's summary's first words (who failed
    first, how, the root cause), for `trainscale report`."""
    failure = (
        [
            line.strip().removeprefix("trainscale: training FAILED — ").split("; rank ")[0]
            for line in summary.splitlines()
            if line.startswith(("trainscale: training FAILED", "Root cause:"))
        ]
        if not ok
        else []
    )
    drop_empty_stacks(records)
    # the ranks' step records are the evidence of training (none: a finished run started again, resumed past its end)
    trained = {"trained": trained} if ok and (trained := trained_here(records)) is not None else {}
    for where in {logs, records}:
        path = where / RUN_RECORD
        try:
            mine = json.loads(path.read_text()).get("logs") == str(logs)
        except (OSError, json.JSONDecodeError):
            mine = False
        if mine:
            write_record(where, ok=ok, seconds=round(seconds, 3), **({"failure": failure} if failure else trained))


def drop_empty_stacks(records: Path | None) -> None:
    """A rank's watchdog opens ``hangs/stacks-rank<R>.txt`` ahead, for its C thread to write when the rank is
    held up; a rank the launcher stopped cannot remove its own empty one: they go, and ``hangs/`` if left empty."""
    if not records:
        return
    for path in Path(records).glob("hangs/stacks-rank*.txt"):
        with contextlib.suppress(OSError):
            if not path.stat().st_size:
                path.unlink()
    with contextlib.suppress(OSError):
        (Path(records) / "hangs").rmdir()


def trained_here(records: Path | None) -> bool | None:
    """Whether a rank recorded an optimizer step in ``records`` (metrics/rank-*.jsonl); None with the records off
    (``TRAINSCALE_RECORD=0``): nothing says."""
    if os.environ.get("TRAINSCALE_RECORD", "1") == "0":
        return None
    return bool(records) and any((Path(records) / "metrics").glob("rank-*.jsonl"))


def start_record(
    run_dir: Path,
    *,
    target: str,
    args: tuple[str, ...],
    module: bool,
    no_python: bool,
    nproc_per_node: int,
    nnodes: str,
    max_restarts: int,
    records: Path,
    logs: Path | None = None,
    command: list[str] | None = None,
) -> Path:
    workload = args[0] if module and target == WORKLOADS_MODULE and args else None
    return write_record(
        run_dir,
        kind="run",
        command=command or command_line(),
        cwd=os.getcwd(),
        started_at=datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        host=socket.gethostname(),
        workload=workload,
        target=None if workload else target,
        target_kind="workload" if workload else ("module" if module else "program" if no_python else "script"),
        args=list(args[1:] if workload else args),
        nproc_per_node=nproc_per_node,
        nnodes=nnodes.split(":")[0] if len(set(nnodes.split(":"))) == 1 else nnodes,
        max_restarts=max_restarts,
        records=str(records),
        logs=str(logs or run_dir),
        versions=versions(),
        # what `report --against` names when two runs differ: the settings that change a step, the script's contents
        environment={k: v for k, v in os.environ.items() if k.startswith(("TRAINSCALE_", "OMP_", "NCCL_"))},
        script_sha256=_sha256(target) if not (module or no_python) else None,
    )


def _sha256(path: str) -> str | None:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        return None


def command_line() -> list[str]:
    """The command that is running, as the user typed it."""
    program = Path(sys.argv[0]).name
    return ["trainscale" if program in ("trainscale", "__main__.py") else sys.argv[0], *sys.argv[1:]]


def shown(path: Path) -> str:
    """A path as the user would type it: relative to the working directory when inside it or beside it
    (``../logs/...``, as seed 003's ``--log-dir ../logs``), else absolute."""
    resolved = Path(path).resolve()
    relative = os.path.relpath(resolved, Path.cwd().resolve())
    return relative if not relative.startswith("../..") else str(resolved)
