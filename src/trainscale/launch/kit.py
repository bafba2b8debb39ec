"""The job kit: the few standard-library-only modules of trainscale a job needs when its Python has
torch but not trainscale: a stock container's, or the python3 a module loads (launch/slurm/toolchain.py).

A container job's batch script runs, with the image's own Python:

    python3 "$KIT/port.py" --host "$MASTER_ADDR"          # names the Python; a free rendezvous port on the first node
    python3 "$KIT/boot.py" --script train.py ARGS...       # each worker: world, GPU, CPUs, @record

The kit is a copy of those modules (`trainscale.env`, `trainscale.topology`, the bootstrap and the
port check, and the recorder and heartbeat the bootstrap loads once the script has imported the image's
torch) in a directory named after their content hash, written once beside the jobs at
submission: a queued job keeps running the kit it was submitted with. Before the user's script
starts, the bootstrap drops the kit from ``sys.path`` (``leave_kit``), so a script that imports
trainscale gets the image's own installation or a plain ModuleNotFoundError.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from pathlib import Path

import trainscale

PACKAGE = Path(trainscale.__file__).parent

# Relative to the package; each is standard library only, or imported only after the script imported torch
# (tests/unit/test_worker_world.py runs the kit with a bare interpreter that has neither torch nor trainscale's
# dependencies; tests/slurm/test_containers.py records a script's steps in a stock image).
MODULES = (
    "__init__.py",
    "_version.py",
    "errors.py",
    "env/__init__.py",
    "env/address.py",
    "env/base.py",
    "env/mpi.py",
    "env/single.py",
    "env/slurm.py",
    "env/torchrun.py",
    "topology/__init__.py",
    "topology/apply.py",
    "topology/cpulist.py",
    "topology/detect.py",
    "topology/model.py",
    "topology/nvidia.py",
    "topology/plan.py",
    "topology/rocm.py",
    "topology/sysfs.py",
    "topology/worker.py",
    "launch/__init__.py",
    "launch/bootstrap.py",
    "launch/ports.py",
    "launch/spawned.py",  # (imported by name in a spawned process, where the kit is not on its path: not used)
    # installs the observation; what it loads only after the script imported the image's torch:
    # the step records and the hang watch, for a script in a stock container too
    "observe/__init__.py",
    "observe/worker.py",
    "observe/hooks.py",
    "observe/models.py",
    "observe/steps.py",
    "observe/records.py",
    "observe/state.py",
    "observe/place.py",
    "observe/window.py",
    "observe/sampler.py",
    "observe/devices.py",
    "observe/stragglers.py",
    "observe/flops.py",
    "runtime/__init__.py",
    "runtime/hangwatch/__init__.py",
    "runtime/hangwatch/heartbeat.py",
    "runtime/hangwatch/watch.py",
    "runtime/hangwatch/ledger.py",
    "runtime/hangwatch/verdict.py",
    "runtime/hangwatch/peers.py",
    "runtime/memory.py",
)

BOOT = '''"""trainscale job kit: run one worker (see trainscale/launch/bootstrap.py)."""
import os
import sys

kit = os.path.dirname(os.path.abspath(__file__))
os.environ["TRAINSCALE_KIT"] = kit  # the bootstrap removes the kit from sys.path before user code
if sys.path[0] != kit:
    sys.path.insert(0, kit)
from trainscale.launch.bootstrap import main

main(sys.argv[1:])
'''

PORT = '''"""trainscale job kit: name the job's Python, print a free port on this host (trainscale/launch/ports.py)."""
import importlib.metadata
import importlib.util
import os
import sys

try:
    torch = importlib.metadata.version("torch") if importlib.util.find_spec("torch") else "not installed"
except importlib.metadata.PackageNotFoundError:
    torch = "unknown version"
print(f"trainscale: the job's Python is {sys.executable} (Python {sys.version.split()[0]}), torch {torch}",
      file=sys.stderr, flush=True)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from trainscale.launch.ports import main

raise SystemExit(main(sys.argv[1:]))
'''

ENTRY_POINTS = {"boot.py": BOOT, "port.py": PORT}


def _contents() -> dict[str, bytes]:
    files = {f"trainscale/{rel}": (PACKAGE / rel).read_bytes() for rel in MODULES}
    files.update({name: text.encode() for name, text in ENTRY_POINTS.items()})
    return files


def kit_name() -> str:
    """``kit-<hash>``: the kit's directory name, fixed by what it holds."""
    digest = hashlib.sha256()
    for name, data in sorted(_contents().items()):
        digest.update(name.encode() + b"\0" + data + b"\0")
    return f"kit-{digest.hexdigest()[:12]}"


def kit_dir(root: Path) -> Path:
    """Where the kit for jobs written under ``root`` (a job output directory) lives."""
    return Path(root) / ".trainscale" / kit_name()


def write_kit(root: Path) -> Path:
    """Write the kit under ``root`` unless it is already there; returns its directory.

    Written into a temporary sibling and renamed, so a job never sees half a kit; an existing kit
    is never changed (its name is its content).
    """
    target = kit_dir(root)
    if target.is_dir():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".partial-", dir=target.parent))
    try:
        for name, data in _contents().items():
            path = tmp / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        os.chmod(tmp, 0o755)
        try:
            tmp.rename(target)
        except OSError:  # another submission wrote the same kit first
            if not target.is_dir():
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return target
