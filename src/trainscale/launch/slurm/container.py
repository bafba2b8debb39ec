"""The container around a job's commands, in the forms centres document (pure; golden-tested; the forms:
docs/slurm.md, "Container forms centres document").

The job's own directories are bound in as well (the job output directory with the kit, the logs and
the run's snapshot of the code; the code's original root, which the snapshot's links to data point
into), so a stock image sees exactly what the job needs.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from trainscale.launch.slurm.spec import JobPlan, SlurmJobSpec
from trainscale.launch.slurm.toolchain import JobPython
from trainscale.profiles.schema import ClusterProfile, ContainerSpec


@dataclass(frozen=True)
class Wrapper:
    words: list[str] = field(default_factory=list)
    """Command words before the program (``singularity exec ... IMAGE``), one string per continuation line."""
    srun_options: list[str] = field(default_factory=list)
    """Options that go on srun itself (pyxis)."""


def _q(value: str | Path) -> str:
    return shlex.quote(str(value))


def container_of(profile: ClusterProfile) -> ContainerSpec:
    if profile.container is not None:
        return profile.container
    return ContainerSpec(flags={"nvidia": ("--nv",), "amd": ("--rocm",)}.get(profile.gpu_vendor, ()))


def binds_of(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan) -> list[str]:
    """The profile's binds, the job's ``--bind``s, then the job's own directories unless already bound."""
    binds = list(container_of(profile).binds) + list(spec.binds)
    for path in [str(plan.output_dir)] + ([str(plan.code_root)] if plan.code_root is not None else []):
        sources = [bind.split(":", 1)[0].rstrip("/") for bind in binds]
        if not any(src and (path == src or path.startswith(src + "/")) for src in sources):
            binds.append(path)
    return binds


def _setup_words(spec: SlurmJobSpec, profile: ClusterProfile) -> list[str]:
    setup = list(container_of(profile).setup) + list(spec.container_setup)
    if not setup:
        return []
    # Expanded inside the container (single-quoted here): LUMI images define $WITH_CONDA themselves.
    return ["bash -c " + _q("; ".join(setup) + '; exec "$@"') + " bash"]


def container_prefix(spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan) -> Wrapper:
    if not spec.container:
        return Wrapper()
    c = container_of(profile)
    binds = binds_of(spec, profile, plan)
    setup = _setup_words(spec, profile)
    if c.kind == "pyxis":
        opts = [f"--container-image={_q(spec.container)}"]
        if binds:
            opts.append("--container-mounts=" + _q(",".join(b if ":" in b else f"{b}:{b}" for b in binds)))
        return Wrapper(words=setup, srun_options=opts)
    mode = spec.container_mode or c.mode
    words = [c.runtime, mode]
    if binds:
        words += ["-B", ",".join(binds)]
    words += list(c.flags)
    return Wrapper(words=[" ".join(_q(w) for w in words) + " " + _q(spec.container)] + setup)


def required_modules(spec: SlurmJobSpec, plan: JobPlan, kit: bool) -> tuple[str, ...]:
    """What a kit job's Python (an image's, a module's) must import (checked when the job starts)."""
    if not kit:
        return ()
    return ("torch", "trainscale") if plan.facts.imports_trainscale else ("torch",)


def port_command(
    spec: SlurmJobSpec, profile: ClusterProfile, plan: JobPlan, python: JobPython, require: tuple[str, ...]
) -> list[str]:
    """The lines that set MASTER_PORT; with the kit they also prove the job's Python can run the job and
    name it in the batch output."""
    program = '"$KIT/port.py"' if python.kit else "-m trainscale.launch.ports"
    cmd = f'{_q(python.command)} {program} --host "$MASTER_ADDR"' + (
        f" --port {spec.master_port}" if spec.master_port else ""
    )
    if not python.kit:
        return [f"MASTER_PORT=$({cmd})"]
    wrapper = container_prefix(spec, profile, plan)
    cmd += " --require " + ",".join(require)
    if wrapper.srun_options:  # pyxis: only srun can enter the image; one task on this (the first) node
        run = " ".join(['srun --nodes=1 --ntasks=1 -w "$MASTER_ADDR"', *wrapper.srun_options, *wrapper.words, cmd])
    else:
        run = " ".join([*wrapper.words, cmd])
    need = "Python with " + " and ".join(require)
    if spec.container:
        what = f"the image {spec.container}"
        fix = (
            "the script imports trainscale: make a venv inside the image (python3 -m venv --system-site-packages), "
            "pip install -e YOUR_TRAINSCALE_CLONE into it and pass --python VENV/bin/python"
            if "trainscale" in require
            else f"check --python (now {python.command}), or run the image's own set-up first: --container-setup "
            "'$WITH_CONDA' (LUMI's images) or --container-run"
        )
    else:
        what = "the job's Python" + (" after its module lines" if python.source == "modules" else "")
        fix = (
            f"load the module that provides {' and '.join(require)} (--module 'load PyTorch/...'), or name the "
            "Python with --python PATH"
        )
    return [
        f"if ! MASTER_PORT=$({run}); then",
        f'  echo "trainscale: error: {what} cannot run this job: it needs {need} as '
        f'{python.command} (see the lines above)" >&2',
        f'  echo "hint: {fix}" >&2'.replace("$WITH_CONDA", "\\$WITH_CONDA"),
        "  exit 1",
        "fi",
    ]
