"""The worker entry point winds torch.distributed down before the interpreter shuts down."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import os, sys
import torch, torch.distributed as dist
from trainscale.launch.bootstrap import release_process_groups

def gloo_threads():
    names = (open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))
    return sum(name.startswith(("pt_gloo", "gloo")) for name in names)

dist.init_process_group("gloo", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
tensor = torch.ones(3)
dist.all_reduce(tensor)
print("before", gloo_threads())
release_process_groups()  # the script never destroyed its group
print("after", gloo_threads(), dist.is_initialized())
"""


def test_a_group_the_script_left_is_destroyed_and_its_threads_joined(tmp_path):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "store")], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert int(lines["before"]) >= 2  # gloo's run loops and its transport loop
    assert lines["after"] == "0 False"
