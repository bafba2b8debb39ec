"""Before submitting a container job, look into the image from the login node when the container
runtime is there (LUMI's and most centres' login nodes have it): does the image hold the Python the
job will run, with torch (and trainscale, for a script that imports it)? Acts (starts a container),
so it is kept apart from the pure lint; its answers are lint findings all the same."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from trainscale.launch.slurm.container import _setup_words, binds_of, container_of, required_modules
from trainscale.launch.slurm.lint import ERROR, NOTE, Finding
from trainscale.launch.slurm.spec import JobPlan, SlurmJobSpec
from trainscale.profiles.schema import ClusterProfile

TIMEOUT_S = 120


def probe_command(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan, python: str) -> list[str]:
    """``RUNTIME exec|run [-B ...] [flags] IMAGE [setup] PYTHON -c CHECK``: the job's own way into the image."""
    c = container_of(profile)
    binds = [b for b in binds_of(spec, profile, plan) if Path(b.split(":", 1)[0]).exists()]
    words = [c.runtime, spec.container_mode or c.mode]
    if binds:
        words += ["-B", ",".join(binds)]
    words += [*c.flags, str(spec.container)]
    for setup in _setup_words(spec, profile):
        words += shlex.split(setup)
    check = ("import importlib.util, sys; missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]; "
             "print(sys.version.split()[0], *missing); sys.exit(3 if missing else 0)")
    return words + [python, "-c", check, *required_modules(spec, plan)]


def probe_container(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan, *, run=subprocess.run) -> list[Finding]:
    if not spec.container:
        return []
    c = container_of(profile)
    if c.kind == "pyxis" or not Path(spec.container).exists():
        return []  # pyxis images live in registries; a URI or a missing path is the lint's to report
    if not shutil.which(c.runtime):
        return [Finding(NOTE, f"cannot look into {spec.container} here: `{c.runtime}` is not on this machine's PATH",
                        "the job checks the image in its first seconds instead")]
    from trainscale.launch.slurm.render import python_of

    python = python_of(spec)
    try:
        done = run(probe_command(spec, profile, plan, python), capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return [Finding(NOTE, f"looking into {spec.container} took over {TIMEOUT_S} s; not checked here",
                        "the job checks the image in its first seconds instead")]
    words = done.stdout.split()
    if done.returncode == 0:
        return []
    if done.returncode == 3 and words:
        missing = " and ".join(words[1:])
        hint = ("make a venv inside the image (python3 -m venv --system-site-packages VENV; VENV/bin/pip install "
                "trainscale) and pass --python VENV/bin/python") if "trainscale" in words[1:] else \
            "choose an image with PyTorch, or the image's own Python (--python, --container-setup, --container-run)"
        return [Finding(ERROR, f"{python} in {spec.container} (Python {words[0]}) cannot import {missing}", hint)]
    said = " ".join((done.stderr or done.stdout).split())[-300:]
    return [Finding(ERROR, f"{python} cannot be run inside {spec.container}: {said or f'exit code {done.returncode}'}",
                    "give the image's Python with --python (e.g. /opt/conda/bin/python), or set it up first with "
                    "--container-setup '$WITH_CONDA' (LUMI's images) or --container-run")]
