"""Before submitting, look at the Python the job will run (launch/slurm/toolchain.py) from the login node,
the job's way where that can be done here: inside the image, through the module lines in a bash shell,
or by asking the interpreter (docs/slurm.md, "Which Python the job runs").

Each answer is a lint finding: a note naming the Python and its torch, or an error when it cannot run
the job. Acts (starts processes), so it is kept apart from the pure lint.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path

from trainscale.launch.slurm.container import _setup_words, binds_of, container_of, required_modules
from trainscale.launch.slurm.lint import ERROR, NOTE, VENV_FIX, Finding
from trainscale.launch.slurm.spec import JobPlan, SlurmJobSpec
from trainscale.launch.slurm.toolchain import JobPython, job_python, module_lines
from trainscale.profiles.schema import ClusterProfile

TIMEOUT_S = 120
MISSING = 3
NO_MODULE, NO_PYTHON = 90, 91
CHECK = (
    "import importlib.util, importlib.metadata as md, sys\n"
    "def v(n):\n"
    "    if importlib.util.find_spec(n) is None: return '-'\n"
    "    try: return md.version(n)\n"
    "    except md.PackageNotFoundError: return '?'\n"
    "missing = [m for m in sys.argv[1:] if importlib.util.find_spec(m) is None]\n"
    "print(sys.executable, sys.version.split()[0], v('torch'), *missing)\n"
    "sys.exit(3 if missing else 0)"
)
OTHER = "another Python: --python PATH; other modules: --module LINE, --no-profile-modules"


def container_command(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan, python: str) -> list[str]:
    """``RUNTIME exec|run [-B ...] [flags] IMAGE [setup] PYTHON -c CHECK``: the job's own way into the image."""
    c = container_of(profile)
    binds = [b for b in binds_of(spec, profile, plan) if Path(b.split(":", 1)[0]).exists()]
    words = [c.runtime, spec.container_mode or c.mode]
    if binds:
        words += ["-B", ",".join(binds)]
    words += [*c.flags, str(spec.container)]
    for setup in _setup_words(spec, profile):
        words += shlex.split(setup)
    return words + [python, "-c", CHECK, *required_modules(spec, plan, True)]


def modules_command(lines: tuple[str, ...], python: str, need: tuple[str, ...]) -> list[str]:
    """bash: the module system as the batch script finds it, the module lines, then the Python's answer."""
    script = "\n".join(
        [
            "if ! type module >/dev/null 2>&1; then",
            "  for init in /usr/share/lmod/lmod/init/bash /etc/profile.d/lmod.sh /etc/profile.d/modules.sh; do",
            '    if [ -r "$init" ]; then . "$init"; break; fi',
            "  done",
            "fi",
            f"type module >/dev/null 2>&1 || exit {NO_MODULE}",
            *lines,
            f"command -v {shlex.quote(python)} >/dev/null 2>&1 || exit {NO_PYTHON}",
            f"exec {shlex.quote(python)} -c {shlex.quote(CHECK)} {' '.join(need)}",
        ]
    )
    return ["bash", "-c", script]


def _answer(
    done: subprocess.CompletedProcess, python: JobPython, spec: SlurmJobSpec, where: str, fix: str
) -> list[Finding]:
    words = done.stdout.split()
    if done.returncode in (0, MISSING) and len(words) >= 3:
        exe, version, torch = words[:3]
        missing = words[3:]
        named = (
            f"{python.describe(spec)}"
            + (f": {exe}" if exe != python.command else "")
            + f" (Python {version}), torch {torch if torch != '-' else 'missing'}"
        )
        if done.returncode == 0:
            return [Finding(NOTE, f"the job runs {named}", OTHER)]
        return [Finding(ERROR, f"the job would run {named}, which cannot import {' and '.join(missing)}{where}", fix)]
    said = " ".join((done.stderr or done.stdout).split())[-300:]
    return [Finding(ERROR, f"{python.command} cannot be run{where}: {said or f'exit code {done.returncode}'}", fix)]


def _container(spec, profile, plan, python: JobPython, run) -> list[Finding]:
    c = container_of(profile)
    later = Finding(
        NOTE,
        f"the job runs {python.describe(spec)}; which one, and its torch, is known when the job "
        "starts (its batch output names it)",
        OTHER,
    )
    if c.kind == "pyxis" or not Path(spec.container).exists():
        return [later]  # pyxis images live in registries; a URI or a missing path is the lint's to report
    if not shutil.which(c.runtime):
        return [
            Finding(
                NOTE,
                f"cannot look into {spec.container} here: `{c.runtime}` is not on this machine's "
                "PATH; the job checks the image in its first seconds instead",
                OTHER,
            )
        ]
    try:
        done = run(
            container_command(spec, profile, plan, python.command), capture_output=True, text=True, timeout=TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        return [
            Finding(
                NOTE,
                f"looking into {spec.container} took over {TIMEOUT_S} s; not checked here",
                "the job checks the image in its first seconds instead",
            )
        ]
    words = done.stdout.split()
    if done.returncode == MISSING and len(words) >= 3:  # the form the container tests and users know
        missing = " and ".join(words[3:])
        hint = (
            VENV_FIX
            if "trainscale" in words[3:]
            else "choose an image with PyTorch, or the image's own Python "
            "(--python, --container-setup, --container-run)"
        )
        return [
            Finding(ERROR, f"{python.command} in {spec.container} (Python {words[1]}) cannot import {missing}", hint)
        ]
    if done.returncode != 0:
        said = " ".join((done.stderr or done.stdout).split())[-300:]
        return [
            Finding(
                ERROR,
                f"{python.command} cannot be run inside {spec.container}: {said or f'exit code {done.returncode}'}",
                "give the image's Python with --python (e.g. /opt/conda/bin/python), or set it up first with "
                "--container-setup '$WITH_CONDA' (LUMI's images) or --container-run",
            )
        ]
    return _answer(done, python, spec, "", OTHER)


def probe_python(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan, *, run=subprocess.run) -> list[Finding]:
    """What the job's Python is and whether it can run the job, as far as this machine can tell."""
    python = job_python(spec, profile)
    if spec.container:
        return _container(spec, profile, plan, python, run)
    need = required_modules(spec, plan, True) if python.kit else ("torch", "trainscale")
    lines = module_lines(spec, profile)
    fix = (
        f"load the module that provides {' and '.join(need)} (--module 'load PyTorch/...'), or name a Python "
        "with --python PATH"
        if python.kit
        else "install trainscale and torch into that Python, or leave --python out to use the one running trainscale"
    )
    try:
        if lines and (python.kit or not Path(python.command).exists()):
            done = run(modules_command(lines, python.command, need), capture_output=True, text=True, timeout=TIMEOUT_S)
            if done.returncode == NO_MODULE:
                return [
                    Finding(
                        NOTE,
                        f"the job runs {python.describe(spec)}; this machine has no `module` command, "
                        "so which one (and its torch) is known when the job starts: its batch output names "
                        "it",
                        OTHER,
                    )
                ]
            if done.returncode == NO_PYTHON:
                return [
                    Finding(
                        ERROR,
                        f"there is no {python.command} on the PATH after the job's module lines "
                        "(loaded here as the job loads them)",
                        fix,
                    )
                ]
            return _answer(done, python, spec, " (after the module lines, loaded here as the job loads them)", fix)
        if python.at_job_time and not shutil.which(python.command):
            return [
                Finding(
                    NOTE,
                    f"the job runs {python.describe(spec)}, which is not on this machine's PATH; "
                    "it is looked up when the job starts",
                    OTHER,
                )
            ]
        if not python.at_job_time and not Path(python.command).exists():
            return [
                Finding(
                    NOTE,
                    f"the job runs {python.describe(spec)}, which is not on this machine; the nodes must have it",
                    OTHER,
                )
            ]
        done = run([python.command, "-c", CHECK, *need], capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return [Finding(NOTE, f"asking {python.command} took over {TIMEOUT_S} s; not checked here", OTHER)]
    except OSError as exc:
        return [Finding(ERROR, f"{python.command} cannot be run here: {exc.strerror}", fix)]
    return _answer(done, python, spec, "", fix)
