"""Atomic, resumable checkpoints: rank-0 files and sharded directories behind one Checkpointer.

layout.py is the on-disk contract; state.py the typed interface (Stateful entries, a strategy's
ModelState and its Storage: FILE, DCP or NATIVE); files.py and sharded.py write and read those on disk;
manager.py the Checkpointer over them; background.py saving in the background (staging, one in flight).
"""

from trainscale.checkpoint.atomic import atomic_torch_save, atomic_write, atomic_write_text
from trainscale.checkpoint.files import load_file
from trainscale.checkpoint.layout import list_checkpoints
from trainscale.checkpoint.manager import Checkpointer, Found, find_latest
from trainscale.checkpoint.state import ModelState, RNGState, Stateful

__all__ = [
    "Checkpointer",
    "Found",
    "find_latest",
    "list_checkpoints",
    "load_file",
    "atomic_torch_save",
    "atomic_write",
    "atomic_write_text",
    "ModelState",
    "RNGState",
    "Stateful",
]
