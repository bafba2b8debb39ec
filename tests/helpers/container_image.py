"""Build a stock-container-like image for the tests: Python and torch (and numpy), no trainscale.

The image is a directory (a singularity "sandbox" image) that tests/containers/singularity runs in a
bubblewrap sandbox:

    IMAGE/opt/python/                 a CPython (the test interpreter's base installation, hard-linked)
        lib/python3.X/site-packages/  torch, numpy and what they need; NOT trainscale, python-hostlist,
                                      psutil or rich (trainscale's own dependencies)
    IMAGE/.singularity.d/env/90-environment.sh   like LUMI's older images: defines $WITH_CONDA, which
                                      puts the image's Python first on PATH (plain `exec` does not)
    IMAGE/.singularity.d/runscript    sets the environment up, then runs its arguments (`run`)

So `exec IMAGE python3 ...` without set-up finds no Python with torch (the early-error case),
`exec IMAGE bash -c '$WITH_CONDA; exec "$@"' ...` and `run IMAGE ...` do.
"""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import re
import shutil
import sys
import sysconfig
from pathlib import Path

PACKAGES = ("torch", "numpy")
NOT_IN_IMAGE = ("trainscale", "python-hostlist", "psutil", "rich")

ENV_SCRIPT = """\
# test image environment (sourced by the sandbox before every command)
export LD_LIBRARY_PATH=/opt/python/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export WITH_CONDA='export PATH=/opt/python/bin:$PATH'
"""

RUNSCRIPT = """\
#!/bin/bash
# the image's runscript: its own set-up, then whatever it was asked to run
export PATH=/opt/python/bin:$PATH
exec "$@"
"""


def _name(requirement: str) -> str:
    return re.split(r"[\s;<>=!~\[(]", requirement, maxsplit=1)[0].strip()


def closure(names: tuple[str, ...], refuse: tuple[str, ...] = NOT_IN_IMAGE) -> list[md.Distribution]:
    """The installed distributions ``names`` need (extras and uninstalled requirements left out)."""
    seen: dict[str, md.Distribution] = {}
    todo = list(names)
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        seen[key] = dist
        for req in dist.requires or []:
            if "extra ==" not in req:
                todo.append(_name(req))
    bad = [n for n in seen if n in refuse]
    assert not bad, f"the copy would hold {bad}"
    return list(seen.values())


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _copy_tree(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> None:
    for root, dirs, files in os.walk(src):
        rel = Path(root).relative_to(src)
        dirs[:] = [d for d in dirs if str(rel / d) not in skip]
        for f in files:
            path = Path(root) / f
            if path.is_symlink():
                target = dst / rel / f
                target.parent.mkdir(parents=True, exist_ok=True)
                target.symlink_to(os.readlink(path))
            else:
                _link_or_copy(path, dst / rel / f)


def copy_distributions(names: tuple[str, ...], site: Path, refuse: tuple[str, ...] = NOT_IN_IMAGE) -> None:
    """Hard-link (or copy) the installed distributions ``names`` need into the site-packages ``site``, each
    module with its bytecode: a stock image ships it compiled, and a read-only image cannot cache it (without
    it every rank would compile torch again, seconds of CPU each). The bytecode is not in a distribution's
    file list when the environment compiled it after pip installed it."""
    ours = Path(sysconfig.get_paths()["purelib"])
    site.mkdir(parents=True, exist_ok=True)
    for dist in closure(names, refuse):
        for file in dist.files or []:
            src = Path(dist.locate_file(file))
            if not (src.is_file() and ours in src.parents):
                continue
            cached = Path(importlib.util.cache_from_source(str(src))) if src.suffix == ".py" else None
            for path in (src, cached) if cached and cached.is_file() else (src,):
                if not (site / path.relative_to(ours)).exists():  # a record that lists the bytecode too
                    _link_or_copy(path, site / path.relative_to(ours))


def build_image(dest: Path) -> Path:
    """Write the image into ``dest`` (a new directory) and return it."""
    base = Path(sys.base_prefix)
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    opt = dest / "opt" / "python"
    _copy_tree(base / "bin", opt / "bin")
    _copy_tree(base / "lib", opt / "lib", skip=(f"{version}/site-packages",))
    copy_distributions(PACKAGES, opt / "lib" / version / "site-packages")
    meta = dest / ".singularity.d"
    (meta / "env").mkdir(parents=True)
    (meta / "env" / "90-environment.sh").write_text(ENV_SCRIPT)
    (meta / "runscript").write_text(RUNSCRIPT)
    (meta / "runscript").chmod(0o755)
    return dest
