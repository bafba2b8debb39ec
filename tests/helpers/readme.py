"""README is a test: every command of its ```bash blocks, then of docs/tour.md's (the tour of every command
README points to), runs in order, as a newcomer pastes them into a shell. The journey is cut at section
boundaries into PARTS, each a test module of its own (tests/integration/test_readme*.py), so that the test
processes run them side by side and none is the suite's critical path. Each part runs its commands in order
in one fresh directory, where README's script was saved as train.py (as README says, before its first
`trainscale run`), after the earlier commands it depends on (NEEDS: what a reader pasting from the top would
have run by then, pasted as they are).

Cluster lines run on the two-node SLURM test cluster (README's `--profile local-test`); lines for a real
site (`--profile lumi`) are dry runs in README itself. The few commands that cannot run here are listed in
SKIPPED or REPLACED with the reason; a command that fails fails its part with the command and its output,
and a command in a section no part names fails test_readme.py's placement test.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
TOUR = ROOT / "docs" / "tour.md"
MARK = "## README $ "
"""Printed before each command on both streams (then each command's output can be found)."""
NEEDED = "(needed) "
"""After MARK for a command of an earlier part that this part runs first (NEEDS)."""
CLOCK = "## README @ "
LIMIT_S = 1100
"""A part's commands, all together; each part takes 3 to 5 minutes alone here (docs/development.md). Its
module's first test, which runs the part in its fixture, has a timeout above it (pytest-timeout's 1200 s)."""

PARTS: dict[str, list[tuple[str, str]]] = {
    # part (its module: tests/integration/test_readme<_part>.py) -> the sections it runs: (file, the start of
    # the section's "## " heading; "" is every section of the file). Every section is in exactly one part.
    "readme": [("README.md", "")],
    "tour_run": [
        ("docs/tour.md", "`trainscale run`"),
        ("docs/tour.md", "The built-in workloads"),
        ("docs/tour.md", "Strategies"),
    ],
    "tour_slurm": [
        ("docs/tour.md", "`trainscale slurm`"),
        ("docs/tour.md", "`trainscale profiles`"),
        ("docs/tour.md", "`trainscale bench`"),
    ],
    "tour_plan": [
        ("docs/tour.md", "`trainscale plan`"),
        ("docs/tour.md", "`trainscale report`"),
        ("docs/tour.md", "`trainscale doctor`"),
    ],
    "tour_selftest": [
        ("docs/tour.md", "`trainscale selftest`"),
        ("docs/tour.md", "Trackers"),
    ],
}
LONGEST_FIRST = ("tour_run", "tour_selftest", "tour_plan", "tour_slurm", "readme")
"""The parts by their time alone (docs/development.md): tests/conftest.py starts their modules first, in this order."""
NEEDS: dict[str, list[str]] = {
    # part -> the starts of the earlier parts' commands it runs first, in order, and why
    "tour_slurm": [
        "touch lumi-pytorch.sif",  # the image's stand-in, for the tour's --container dry run
    ],
    "tour_plan": [
        "make demo",  # a study, for `trainscale report bench-out/latest`
        # a job submitted with trainscale slurm, for `report trainscale-jobs/latest` and `report last`
        "trainscale slurm --profile local-test -N 2 --gpus-per-node 2 -t 00:10:00 --submit --watch",
    ],
}

SKIPPED = {
    "make test": "the whole suite, which runs this test",
    "source .venv/bin/activate": "this test's environment has trainscale on PATH already",
    "pip install -e '.[trackers]'": "no network in tests; the test extra installs the trackers",
    "singularity exec lumi-pytorch.sif bash -c '$WITH_CONDA && python3 -m venv --system-site-packages venv-ts && "
    "venv-ts/bin/pip install -e PATH_TO_CLONE'": "LUMI's image and singularity: the dry run after it is the test",
}
REPLACED = {
    # `make demo` makes .venv first; here it exists (the suite runs in it), so the recipe's own command runs
    "make demo": lambda: demo_recipe(),
}


def module(part: str) -> str:
    """The test module that runs ``part``."""
    return "test_readme.py" if part == "readme" else f"test_readme_{part}.py"


def demo_recipe() -> str:
    line = next(ln for ln in (ROOT / "Makefile").read_text().splitlines() if "-m trainscale bench" in ln)
    return line.strip().replace("$(PY)", shlex.quote(sys.executable)).replace("$$", "$")


def commands(text: str) -> list[str]:
    """The commands of a page's bash blocks in order: continuation lines joined, a heredoc kept whole with
    its command, comment lines dropped."""
    return [command for _, command in sectioned(text)]


def sectioned(text: str) -> list[tuple[str, str]]:
    """``commands(text)``, each with the "## " heading of the section it is in ("" before the first)."""
    out: list[tuple[str, str]] = []
    heading = ""
    prose = re.split(r"```bash\n(.*?)```", text, flags=re.S)  # prose, block, prose, block, ...
    for index, piece in enumerate(prose):
        if index % 2 == 0:
            headings = re.findall(r"^## (.*)$", re.sub(r"```.*?```", "", piece, flags=re.S), re.M)
            heading = headings[-1] if headings else heading
            continue
        lines = piece.splitlines()
        i = 0
        while i < len(lines):
            line = lines[i]
            i += 1
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            command = line
            while command.endswith("\\") and i < len(lines):
                command = command[:-1] + " " + lines[i].strip()
                i += 1
            here = re.search(r"<<\s*'?(\w+)'?", command)
            if here:
                body = []
                while i < len(lines) and lines[i] != here.group(1):
                    body.append(lines[i])
                    i += 1
                i += 1
                command = "\n".join([command, *body, here.group(1)])
            out.append((heading, command))
    return out


def key(command: str) -> str:
    """The command without its trailing comment."""
    return re.sub(r"\s+#.*$", "", command.splitlines()[0]).strip()


def pasted() -> list[tuple[str, str, str]]:
    """README, then the tour: what a reader pastes, in order, as (file, section heading, command)."""
    return [
        (page.relative_to(ROOT).as_posix(), heading, command)
        for page in (README, TOUR)
        for heading, command in sectioned(page.read_text())
    ]


def parts_of(page: str, heading: str) -> list[str]:
    """The parts that name the section ``heading`` of ``page``."""
    return [name for name, sections in PARTS.items() if any(p == page and heading.startswith(h) for p, h in sections)]


def part_commands(part: str) -> list[str]:
    return [command for page, heading, command in pasted() if parts_of(page, heading) == [part]]


def needed(part: str) -> list[str]:
    """The earlier parts' commands ``part`` runs first (NEEDS), each found once in an earlier part."""
    earlier = [c for name in list(PARTS)[: list(PARTS).index(part)] for c in part_commands(name)]
    out = []
    for start in NEEDS.get(part, []):
        found = [c for c in earlier if key(c).startswith(start)]
        assert len(found) == 1, f"NEEDS[{part!r}]: {len(found)} earlier command(s) start with {start!r}"
        out += found
    return out


def script(part: str) -> str:
    """The bash script a newcomer's pasting amounts to: each command echoed, then run; the first failure stops it."""
    lines = ["set -eo pipefail"]
    for mark, command in [(NEEDED, c) for c in needed(part)] + [("", c) for c in part_commands(part)]:
        k = key(command)
        if k in SKIPPED:
            lines.append(f"echo {shlex.quote(f'{MARK}{mark}{k}: skipped ({SKIPPED[k]})')}")
            continue
        run = REPLACED[k]() if k in REPLACED else command
        said = shlex.quote(MARK + mark + k)
        # on both streams (a skipped one on stdout only), so that each command's output can be found, and
        # when it started
        lines += [f'echo {said}; echo {said} >&2; echo "{CLOCK}$(date +%s.%N)" >&2', run]
    return "\n".join(lines) + "\n"


def readme_train_script() -> str:
    section = README.read_text()[README.read_text().index("## Your script, unchanged") :]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


@dataclass
class Readme:
    """One part's commands, run once in one fresh directory; its tests read what they left."""

    dir: Path
    done: subprocess.CompletedProcess
    env: dict[str, str]

    def command(self, start: str) -> str:
        """The one command of this part that starts with ``start``."""
        ran = [line[len(MARK) :] for line in self.done.stderr.splitlines() if line.startswith(MARK)]
        found = [k for k in ran if k.startswith(start)]
        assert len(found) == 1, f"this part runs {len(found)} command(s) starting with {start!r}: {found}"
        return found[0]

    def output(self, start: str, stream: str = "stdout") -> str:
        """What the command starting with ``start`` printed on ``stream``."""
        lines = getattr(self.done, stream).splitlines()
        begin = lines.index(MARK + self.command(start)) + 1
        end = next((i for i in range(begin, len(lines)) if lines[i].startswith(MARK)), len(lines))
        return "\n".join(lines[begin:end]) + "\n"

    def seconds(self, start: str) -> float:
        """How long the command starting with ``start`` took (to the start of the next one)."""
        lines = self.done.stderr.splitlines()
        ran = [line[len(MARK) :] for line in lines if line.startswith(MARK)]
        starts = [float(line[len(CLOCK) :]) for line in lines if line.startswith(CLOCK)]
        index = ran.index(self.command(start))
        return starts[index + 1] - starts[index]

    def trainscale(self, *argv: str) -> subprocess.CompletedProcess[str]:
        """The next command a reader types, in this part's directory and environment."""
        return subprocess.run(
            [sys.executable, "-m", "trainscale", *argv],
            cwd=self.dir,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
        )


def run_part(part: str, request, tmp_path_factory) -> Readme:
    """The fixture's body: README's train.py saved, then the part's script in a fresh directory; on the test
    cluster when a command of the part needs it."""
    tmp_path = tmp_path_factory.mktemp(f"readme-{part}")
    (tmp_path / "train.py").write_text(readme_train_script())
    text = script(part)
    (tmp_path / "readme.sh").write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINSCALE_", "RANK", "WORLD_SIZE"))}
    if "local-test" in text:
        env.update(request.getfixturevalue("slurm_cluster").env)
    env.update(
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
        TRAINSCALE_STATE_DIR=str(tmp_path / "state"),
        WANDB_MODE="offline",
    )
    with subprocess.Popen(
        ["bash", "readme.sh"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    ) as proc:
        try:
            out, err = proc.communicate(timeout=LIMIT_S)
        except subprocess.TimeoutExpired:  # the command running then, with what it printed, not a bare timeout
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            err += f"\n(stopped: the part ran past {LIMIT_S} s)\n"
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
    (tmp_path / "readme.stdout").write_text(done.stdout)  # kept for a look after the test
    (tmp_path / "readme.stderr").write_text(done.stderr)
    ran = [line[len(MARK) :] for line in done.stderr.splitlines() if line.startswith(MARK)]
    assert done.returncode == 0, (
        f"README command failed ({part}): {ran[-1] if ran else '?'}\n--- stdout (tail)\n"
        f"{done.stdout[-4000:]}\n--- stderr (tail)\n{done.stderr[-6000:]}"
    )
    assert len(ran) == sum(key(c) not in SKIPPED for c in needed(part) + part_commands(part)), ran
    return Readme(tmp_path, done, env)


def part_fixture(part: str):
    """The module-scoped fixture ``readme`` of a part's module."""

    @pytest.fixture(scope="module")
    def readme(request, tmp_path_factory) -> Readme:
        return run_part(part, request, tmp_path_factory)

    return readme
