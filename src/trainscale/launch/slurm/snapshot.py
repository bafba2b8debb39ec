"""The code a job runs: a snapshot of the script's project, copied into the run directory at submission.

Its root, which files are copied, left out or linked, the limits (:data:`MAX_FILES`, :data:`MAX_BYTES`,
:data:`LINK_BYTES`) and how the job's imports find the copy: docs/slurm.md, "The code a job runs".
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import shutil
import site
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from trainscale.errors import ConfigError

MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")
SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        "__pycache__",
        ".venv",
        "venv",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".ipynb_checkpoints",
        "node_modules",
        ".eggs",
        "trainscale-jobs",
        "trainscale-runs",
        "checkpoints",
        "checkpoint",
        "ckpt",
        "ckpts",
    }
)
"""Left out. Checkpoint directories too: a job reads and writes its checkpoints by --checkpoint-dir, from the
working directory it was submitted from, never through its code's snapshot."""
LINK_DIRS = frozenset(
    {
        "data",
        "datasets",
        "dataset",
        "runs",
        "outputs",
        "output",
        "logs",
        "results",
        "wandb",
        "mlruns",
        "lightning_logs",
        "bench-out",
    }
)
LINK_SUFFIXES = frozenset(
    {
        ".pt",
        ".pth",
        ".ckpt",
        ".safetensors",
        ".bin",
        ".npy",
        ".npz",
        ".h5",
        ".hdf5",
        ".parquet",
        ".arrow",
        ".tar",
        ".zip",
        ".gz",
        ".tgz",
        ".xz",
        ".zst",
        ".pkl",
        ".pickle",
        ".idx",
        ".ubyte",
        ".tfrecord",
        ".lmdb",
        ".mdb",
    }
)
SKIP_SUFFIXES = frozenset({".pyc", ".pyo", ".sif", ".sqsh", ".squashfs"})
"""Left out. Container images too: the container runtime opens the job's image by its own path (--container)."""
LINK_BYTES = 10 * 1024**2
"""A file larger than this is linked, not copied."""
MAX_FILES = 20_000
MAX_BYTES = 200 * 1024**2


@dataclass(frozen=True)
class Manifest:
    """What a snapshot of ``root`` holds."""

    root: Path
    mode: str
    """``git`` (git ls-files) or ``files`` (a walk of the directory)."""
    files: tuple[str, ...] = ()
    """Paths below the root that are copied."""
    links: tuple[str, ...] = ()
    """Paths below the root that are linked to their original (data, outputs, large files)."""
    bytes: int = 0
    """Bytes copied."""
    over_limit: bool = False
    """More than MAX_FILES or MAX_BYTES: the listing stopped early."""
    sizes: dict[str, int] = field(default_factory=dict, compare=False)
    """Bytes per top-level entry, for the message when over the limit."""

    def describe(self) -> str:
        linked = (
            f", {len(self.links)} linked ({', '.join(self.links[:4])}{', ...' if len(self.links) > 4 else ''})"
            if self.links
            else ""
        )
        how = "git ls-files" if self.mode == "git" else "every file below it"
        return f"{len(self.files)} files, {_mb(self.bytes)} ({how}){linked}"


def _mb(n: int) -> str:
    return f"{n / 1024**2:.1f} MB" if n >= 1024**2 else f"{n / 1024:.0f} KB" if n >= 1024 else f"{n} bytes"


def _home() -> Path:
    return Path(os.path.expanduser("~")).absolute()


def project_root(start: Path) -> Path | None:
    """The nearest directory from ``start`` upwards that holds a project marker, below the home directory."""
    home = _home()
    for directory in (start, *start.parents):
        if directory == home or directory.parent == directory:
            return None
        if any((directory / marker).exists() for marker in MARKERS):
            return directory
    return None


def widen(root: Path, reached: Iterable[str]) -> Path:
    """``root`` widened to the directories the script reaches relative to its own file; never to the home
    directory, one of its ancestors, or ``/``."""
    paths = [Path(os.path.normpath(p)) for p in reached]
    if not paths:
        return root
    common = Path(os.path.commonpath([str(root), *map(str, paths)]))
    home = _home()
    if common == home or common in home.parents or common.parent == common:
        return root
    return common


def code_root(script: str, reached: Iterable[str] = (), snapshot: str | None = None) -> Path:
    """Where a script's snapshot is taken from (see the module docstring)."""
    if snapshot:
        return Path(snapshot).absolute()
    path = Path(script).absolute()
    return widen(project_root(path.parent) or path.parent, reached)


def installed(path: Path) -> bool:
    """Inside site-packages or the interpreter's own prefix: code a job imports in place, never snapshots."""
    places = [*site.getsitepackages(), site.getusersitepackages(), sys.prefix, sys.base_prefix]
    return any(str(Path(path).absolute()).startswith(str(Path(p).absolute())) for p in places if p)


def module_root(module: str) -> Path | None:
    """For ``-m pkg.mod``: the project holding the package found from the working directory, or None when it
    is installed (site-packages) or not in a project: then the job imports it in place."""
    top = module.split(".")[0]
    if top == "trainscale":  # trainscale's own modules (selftest, bench allreduce) are the tool, not your code
        return None
    for entry in [os.getcwd(), *[p for p in sys.path if p]]:
        try:
            found = importlib.machinery.PathFinder.find_spec(top, [entry])
        except (ImportError, ValueError):
            found = None
        if found is not None:
            break
    else:
        return None
    return None if installed(Path(entry)) else project_root(Path(entry).absolute())


def _git_listing(root: Path) -> tuple[list[str], list[str]] | None:
    """(listed files, ignored entries) of the git work tree holding ``root``, relative to root; None: no git."""
    git = shutil.which("git")
    if not git:
        return None
    try:
        inside = subprocess.run(
            [git, "-C", str(root), "rev-parse", "--is-inside-work-tree"], capture_output=True, text=True, timeout=30
        )
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        listed = subprocess.run(
            [git, "-C", str(root), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
            capture_output=True,
            timeout=120,
        )
        ignored = subprocess.run(
            [git, "-C", str(root), "ls-files", "-z", "--others", "--ignored", "--exclude-standard", "--directory"],
            capture_output=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if listed.returncode != 0:
        return None
    split = lambda out: [p for p in os.fsdecode(out).split("\0") if p]  # noqa: E731
    return sorted(set(split(listed.stdout))), split(ignored.stdout) if ignored.returncode == 0 else []


class _Rules:
    """Which entries below ``root`` are skipped, linked or copied."""

    def __init__(self, root: Path, exclude: Iterable[Path]):
        self.root = root
        self.exclude = [str(Path(p).absolute()) for p in exclude]
        self._skip: dict[Path, bool] = {}  # asked once per directory, not once per file below it

    def excluded(self, path: Path) -> bool:
        text = str(path)
        return any(text == e or text.startswith(e + os.sep) for e in self.exclude)

    def skip_dir(self, path: Path) -> bool:
        if path not in self._skip:
            name = path.name
            self._skip[path] = (
                name in SKIP_DIRS or name.endswith(".egg-info") or self.excluded(path) or (path / "pyvenv.cfg").exists()
            )
        return self._skip[path]

    @staticmethod
    def link_dir(path: Path) -> bool:
        return path.name in LINK_DIRS and not (path / "__init__.py").exists()

    @staticmethod
    def file_kind(path: Path) -> tuple[str, int]:
        """(``skip``, ``link`` or ``copy``, size)."""
        if path.suffix.lower() in SKIP_SUFFIXES:
            return "skip", 0
        try:
            size = path.lstat().st_size
        except OSError:
            return "skip", 0
        if path.is_symlink():
            return "copy", 0
        if path.suffix.lower() in LINK_SUFFIXES or size > LINK_BYTES:
            return "link", size
        return "copy", size


def list_snapshot(root: Path, *, exclude: Iterable[Path] = ()) -> Manifest:
    """What a snapshot of ``root`` would copy and link (nothing is written)."""
    root = Path(root).absolute()
    rules = _Rules(root, exclude)
    git = _git_listing(root)
    files: list[str] = []
    links: set[str] = set()
    sizes: dict[str, int] = {}
    total = 0

    def take(rel: str) -> bool:
        """Classify one listed file; False once over the limits."""
        nonlocal total
        path = root / rel
        parts = Path(rel).parts
        for depth in range(1, len(parts)):
            directory = root.joinpath(*parts[:depth])
            if rules.skip_dir(directory):
                return True
            if rules.link_dir(directory):
                links.add("/".join(parts[:depth]))
                return True
        if rules.excluded(path):
            return True
        kind, size = rules.file_kind(path)
        if kind == "link":
            links.add(rel)
        elif kind == "copy":
            files.append(rel)
            total += size
            sizes[parts[0]] = sizes.get(parts[0], 0) + size
        return len(files) <= MAX_FILES and total <= MAX_BYTES

    over = False
    if git is not None:
        listed, ignored = git
        for rel in listed:
            if not (root / rel).exists() and not (root / rel).is_symlink():
                continue  # deleted in the work tree
            if not take(rel):
                over = True
                break
        for rel in ignored:  # ignored data directories and files are linked so __file__-relative paths still work
            rel = rel.rstrip("/")
            path, parts = root / rel, Path(rel).parts
            if rules.excluded(path) or any(rules.skip_dir(root.joinpath(*parts[:d])) for d in range(1, len(parts))):
                continue
            if path.is_dir():
                if not rules.skip_dir(path) and rules.link_dir(path):
                    links.add(rel)
            elif rules.file_kind(path)[0] == "link":
                links.add(rel)
    else:
        for directory, dirs, names in os.walk(root):
            here = Path(directory)
            keep = []
            for name in sorted(dirs):
                sub = here / name
                if name.startswith(".") or rules.skip_dir(sub):
                    continue
                if sub.is_symlink():
                    names.append(name)  # copied as the link it is
                elif rules.link_dir(sub):
                    links.add(str(sub.relative_to(root)))
                else:
                    keep.append(name)
            dirs[:] = keep
            for name in sorted(names):
                if not take(str((here / name).relative_to(root))):
                    over = True
                    break
            if over:
                break
    # a link inside a linked directory is redundant
    pruned = sorted(link for link in links if not any(link.startswith(other + "/") for other in links))
    return Manifest(
        root=root,
        mode="git" if git is not None else "files",
        files=tuple(files),
        links=tuple(pruned),
        bytes=total,
        over_limit=over,
        sizes=sizes,
    )


def over_limit_message(manifest: Manifest) -> tuple[str, str]:
    biggest = sorted(manifest.sizes.items(), key=lambda kv: -kv[1])[:3]
    named = ", ".join(f"{name} {_mb(size)}" for name, size in biggest)
    message = (
        f"the snapshot of {manifest.root} would copy more than {MAX_FILES} files or {_mb(MAX_BYTES)} (largest: {named})"
    )
    hint = (
        "give --snapshot DIR with the directory of your code only, or move data out of it: data/, checkpoints/, "
        f"*.pt and files over {_mb(LINK_BYTES)} are linked, not copied (docs/slurm.md#the-code-a-job-runs)"
    )
    return message, hint


def _lands_in(link: Path, target: str, root: Path, copied: set[str]) -> bool:
    """Whether the link's ``target`` is something the snapshot copies (so that it resolves in the copy as here)."""
    if os.path.isabs(target):
        return False
    resolved = Path(os.path.normpath(link.parent / target))
    try:
        rel = resolved.relative_to(root).as_posix()
    except ValueError:
        return False
    return rel in copied or any(name.startswith(rel + "/") for name in copied)


def write_snapshot(manifest: Manifest, dest: Path) -> str:
    """Copy the manifest's files and make its links under ``dest``; returns the sha256 of what the job runs
    (every copied path and its content, every link and its target)."""
    if manifest.over_limit:
        message, hint = over_limit_message(manifest)
        raise ConfigError(message, hint=hint)
    digest = hashlib.sha256()
    dest.mkdir(parents=True, exist_ok=True)
    copied = set(manifest.files)
    for rel in manifest.files:
        src, out = manifest.root / rel, dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        if src.is_symlink():
            target = os.readlink(src)
            if _lands_in(src, target, manifest.root, copied):  # resolves inside the copy too: kept as a link
                os.symlink(target, out)
                digest.update(f"{rel}\0link\0{target}\0".encode())
                continue
            if not src.is_file():  # a directory or nothing outside the copy: the original, as a data link
                os.symlink(src.resolve(), out)
                digest.update(f"{rel}\0link\0{src.resolve()}\0".encode())
                continue
            # a file whose relative target would dangle in the copy (the workshop's util.py -> ../util.py with
            # the project's parent left out): its content, as the job must import it
        data = src.read_bytes()
        out.write_bytes(data)
        shutil.copymode(src, out)
        digest.update(rel.encode() + b"\0" + hashlib.sha256(data).digest())
    for rel in manifest.links:
        out = dest / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(manifest.root / rel, out)
        digest.update(f"{rel}\0link\0{manifest.root / rel}\0".encode())
    return digest.hexdigest()
