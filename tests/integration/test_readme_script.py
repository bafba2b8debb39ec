"""The README's DDP script, as printed there, runs on one process and on 2 gloo ranks through
`trainscale run`: it trains (the loss falls), prints once per epoch, and uses no deprecated call."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from integration.test_run_cli import trainscale

README = Path(__file__).parents[2] / "README.md"


def readme_script() -> str:
    text = README.read_text()
    section = text[text.index("## Your script, unchanged from 1 process to N nodes"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def _losses(output: str) -> list[float]:
    return [float(v) for v in re.findall(r"epoch \d: loss ([\d.]+)", output)]


def test_the_readme_script_runs_on_one_process_and_on_two_ranks(tmp_path):
    (tmp_path / "train.py").write_text(readme_script())
    plain = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=240,
                           env={k: v for k, v in os.environ.items() if not k.startswith(("RANK", "WORLD_SIZE"))})
    two = trainscale("run", "--nproc-per-node", "2", "--log-dir", "logs", "train.py", cwd=tmp_path)
    for proc in (plain, two):
        output = proc.stdout + proc.stderr
        assert proc.returncode == 0, output
        losses = _losses(output)
        assert len(losses) == 5, output  # once per epoch: rank 0 only
        assert losses[-1] < losses[0] / 2, losses
        assert "deprecated" not in output, output
