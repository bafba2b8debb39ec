"""README is a test: every command of its ```bash blocks runs, in order, in one fresh directory, as a
newcomer pastes them into one shell (the README's script saved as train.py first, as README says).

Cluster lines run on the two-node SLURM test cluster (README's `--profile local-test`); lines for a real
site (`--profile lumi`) are dry runs in README itself. The few commands that cannot run here are listed in
SKIPPED or REPLACED below with the reason; a README command that fails, or a new one this test cannot
place, fails the test with the command and its output.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.browser import check_page, chromium, screenshot  # noqa: F401  (chromium: a fixture)

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"

SKIPPED = {
    "make test": "the whole suite, which runs this test",
    "source .venv/bin/activate": "this test's environment has trainscale on PATH already",
    "pip install 'trainscale[trackers]'": "no network in tests; the test extra installs the trackers",
    ".venv/bin/python -m pytest tests/unit -q": "part of this suite",
    ".venv/bin/python -m pytest tests/slurm -q": "part of this suite",
    "make test-gpu": "needs a GPU (docs/gpu.md)",
    "make test-scale": "a 16-node cluster and 64 ranks: minutes and most of the memory (docs/scaling.md)",
}
REPLACED = {
    # `make demo` makes .venv first; here it exists (the suite runs in it), so the recipe's own command runs
    "make demo": lambda: demo_recipe(),
}


def demo_recipe() -> str:
    line = next(ln for ln in (ROOT / "Makefile").read_text().splitlines() if "-m trainscale bench" in ln)
    return line.strip().replace("$(PY)", shlex.quote(sys.executable)).replace("$$", "$")


def commands(text: str) -> list[str]:
    """The commands of README's bash blocks in order: continuation lines joined, a heredoc kept whole with
    its command, comment lines dropped."""
    out: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        lines = block.splitlines()
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
            heredoc = re.search(r"<<\s*'?(\w+)'?", command)
            if heredoc:
                body = []
                while i < len(lines) and lines[i] != heredoc.group(1):
                    body.append(lines[i])
                    i += 1
                i += 1
                command = "\n".join([command, *body, heredoc.group(1)])
            out.append(command)
    return out


def key(command: str) -> str:
    """The command without its trailing comment."""
    return re.sub(r"\s+#.*$", "", command.splitlines()[0]).strip()


def script(text: str) -> str:
    """The bash script a newcomer's pasting amounts to: each command echoed, then run; the first failure stops it."""
    parts = ["set -eo pipefail"]
    for command in commands(text):
        k = key(command)
        if k in SKIPPED:
            parts.append(f"echo {shlex.quote(f'== skipped: {k} ({SKIPPED[k]})')}")
            continue
        run = REPLACED[k]() if k in REPLACED else command
        parts += [f"echo {shlex.quote(f'== {k}')} >&2", run]
    return "\n".join(parts) + "\n"


def readme_train_script(text: str) -> str:
    section = text[text.index("## Your script, unchanged"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_every_readme_command_is_placed():
    """A command SKIPPED or REPLACED names must still be in README (else the table is stale)."""
    keys = {key(c) for c in commands(README.read_text())}
    assert set(SKIPPED) | set(REPLACED) <= keys, (set(SKIPPED) | set(REPLACED)) - keys
    assert len(keys) >= 40  # README's command lines, not a handful


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_readme_commands_run_in_order_in_one_fresh_directory(slurm_cluster, tmp_path, chromium, capsys):
    text = README.read_text()
    (tmp_path / "train.py").write_text(readme_train_script(text))
    (tmp_path / "readme.sh").write_text(script(text))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TRAINSCALE_", "RANK", "WORLD_SIZE"))}
    env.update(slurm_cluster.env, PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
               TRAINSCALE_STATE_DIR=str(tmp_path / "state"), WANDB_MODE="offline")
    done = subprocess.run(["bash", "readme.sh"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    ran = [line[3:] for line in done.stderr.splitlines() if line.startswith("== ")]
    assert done.returncode == 0, (f"README command failed: {ran[-1] if ran else '?'}\n--- stdout (tail)\n"
                                  f"{done.stdout[-4000:]}\n--- stderr (tail)\n{done.stderr[-6000:]}")
    assert len(ran) == sum(key(c) not in SKIPPED for c in commands(text))
    # what the README promises the commands leave behind, for the next command a reader types
    # make demo's study with the page `trainscale report bench-out/latest` drew right after it (a later
    # study, the SLURM one, has become bench-out/latest since, and README reads it as text only)
    (demo,) = [p for p in (tmp_path / "bench-out").glob("demo-*") if not p.is_symlink()]
    assert (demo / "report" / "report.html").is_file(), demo
    assert ((tmp_path / "bench-out" / "latest") / "results.json").is_file()
    assert (tmp_path / "trainscale-runs" / "latest" / "run.json").is_file()
    assert (tmp_path / "tuned.toml").is_file() and (tmp_path / "study1" / "results.json").is_file()

    # make demo then `trainscale report` on its study, as the demo's last line says
    assert f"next: trainscale report bench-out/{demo.name}   (the page" in done.stdout
    for name in ("01-1", "02-2"):  # one directory per configuration: its records, logs, what ran
        run = demo / "runs" / name
        assert (run / "metrics" / "rank-0.jsonl").is_file() and (run / "run.json").is_file()
        assert (run / "attempt_0" / "0" / "stdout.log").is_file() and (run / "metrics.json").is_file()
    report = subprocess.run([sys.executable, "-m", "trainscale", "report", demo], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert report.returncode == 0, report.stderr
    text = report.stdout
    assert "what ran   scaling study of workload cnn: weak scaling, 2 epoch(s)" in text
    assert re.search(r"versions\s+trainscale \S+, torch \S+, python \S+", text) and "host       " in text
    assert re.search(r"^\[(problem|note|good)\] DDP 2 CPU ranks: ", text, re.M), text  # the study's verdict
    assert re.search(r"^Single CPU rank\s+1\s", text, re.M) and re.search(r"^DDP 2 CPU ranks\s+2\s", text, re.M)
    for section in ("== Single CPU rank (01-1) ==", "== DDP 2 CPU ranks (02-2) =="):  # each one's own verdict
        part = text.split(section)[1].split("\n== ")[0]
        assert re.search(r"^\[(problem|note|good)\] ", part, re.M) and re.search(r"^rank\s+host\s+steps", part, re.M)
    assert "(no plots" not in text and "matplotlib is not installed" not in text
    for png in ("speedup.png", "throughput.png", "breakdown.png"):
        assert "plot: " in text and png in text
    page = demo / "report" / "report.html"
    assert check_page(chromium, page, tmp_path / "chrome") >= 3  # the study's speedup, throughput, breakdown
    screenshot(chromium, page, tmp_path / "chrome", demo / "report" / "screenshot.png", capsys,
               "`make demo`'s study report", height=4200)
