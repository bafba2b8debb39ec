"""`make demo` installs only what the demo needs (torch, trainscale's own few dependencies, matplotlib for the
plots); `make test` installs the rest (issue 38: the demo once installed DeepSpeed, transformers and the
trackers, 154 packages, in silence)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def recipe(target: str) -> list[str]:
    text = (ROOT / "Makefile").read_text()
    head = re.search(rf"^{target}:(.*)$", text, re.M)
    body = text[head.end() :].split("\n\n")[0]
    return [head.group(1).strip(), *[line.strip().lstrip("@") for line in body.splitlines() if line.strip()]]


def names(requirements: list[str]) -> set[str]:
    return {re.split(r"[<>=;\[ ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_demo_installs_the_bench_extra_only_and_it_holds_nothing_the_demo_does_not_use():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    demo = recipe("demo")
    prerequisite = demo[0].split()
    assert prerequisite == ["venv-demo"], demo
    assert "EXTRAS=bench bash scripts/setup-env.sh" in recipe("venv-demo")
    assert "EXTRAS=test bash scripts/setup-env.sh" in recipe("venv") and recipe("test")[0].split() == ["venv", "lint"]
    installed = names(project["dependencies"]) | names(project["optional-dependencies"]["bench"])
    assert installed == {"torch", "numpy", "python-hostlist", "psutil", "rich", "cloudpickle", "tomli", "matplotlib"}
    heavy = names(project["optional-dependencies"]["test"]) - installed
    assert {"deepspeed", "transformers", "wandb", "mlflow-skinny", "pytest"} <= heavy


def test_setup_says_what_it_installs_and_when_it_is_done():
    text = (ROOT / "scripts" / "setup-env.sh").read_text()
    said = re.findall(r'^\s*say "([^"]+)"', text, re.M)
    assert len(said) >= 3 and said[0].startswith("installing into") and said[-1].startswith("done in")
    assert 'STAMP="$VENV/.trainscale-installed-$EXTRAS"' in text  # the demo's install is not the tests'


def test_the_demos_last_line_works_in_a_new_shell():
    """`make demo`'s last line is the command to paste next: in a new shell `trainscale` is on the PATH only once
    the venv is active, so the line says so first (the study itself is replaced by `true` here)."""
    import subprocess

    done = subprocess.run(
        ["make", "-s", "-o", "venv-demo", "demo", "PY=true"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1].startswith(
        "next: source .venv/bin/activate && trainscale report bench-out/latest"
    ), done.stdout
