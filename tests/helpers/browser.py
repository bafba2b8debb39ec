"""Headless Chromium (Debian's) opening a report page from disk, with no network: the page's own check
(``<body data-report="ok" data-plots="N" data-errors="">``, report/html.py) and a screenshot."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def chromium():
    if shutil.which("chromium") is None:
        done = subprocess.run(
            ["bash", str(ROOT / ".ci" / "install-browser.sh")], capture_output=True, text=True, timeout=900
        )
        if done.returncode != 0:
            if os.environ.get("CI", "").lower() == "true":
                pytest.fail(f"chromium unavailable: {done.stderr.strip()}")
            pytest.skip(f"chromium unavailable: {done.stderr.strip()}")
    return shutil.which("chromium")


def browse(
    chromium: str, page: Path, profile: Path, *extra: str, height: int = 2400
) -> subprocess.CompletedProcess[str]:
    # As the machine's probe runs it: headless, no sandbox (root), no network chatter, a fresh profile.
    flags = [
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--virtual-time-budget=5000",
        f"--window-size=1200,{height}",
    ]
    return subprocess.run([chromium, *flags, *extra, page.as_uri()], capture_output=True, text=True, timeout=120)


def check_page(chromium: str, page: Path, profile: Path) -> int:
    """Opens the page; asserts every plot loaded and no script failed; returns the number of plots."""
    dom = browse(chromium, page, profile, "--dump-dom")
    assert dom.returncode == 0, dom.stderr
    body = re.search(r"<body[^>]*>", dom.stdout).group(0)
    assert 'data-report="ok"' in body and 'data-errors=""' in body, body
    return int(re.search(r'data-plots="(\d+)"', body).group(1))


def screenshot(chromium: str, page: Path, profile: Path, shot: Path, capsys, what: str, height: int = 2400) -> Path:
    """A screenshot of the page, its path printed in the test command's own output (not only under -s)."""
    taken = browse(chromium, page, profile, f"--screenshot={shot}", height=height)
    assert taken.returncode == 0 and shot.stat().st_size > 20_000, taken.stderr
    with capsys.disabled():
        print(f"\n[report] screenshot of {what}: {shot}")
    return shot
