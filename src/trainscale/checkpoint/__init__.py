"""Atomic, resumable checkpoints (rank-0 files here; sharded ones in `sharded`)."""

from trainscale.checkpoint.atomic import atomic_torch_save, atomic_write, atomic_write_text
from trainscale.checkpoint.manager import Checkpointer, Found, find_latest, list_checkpoints, load_file

__all__ = ["Checkpointer", "Found", "find_latest", "list_checkpoints", "load_file", "atomic_torch_save",
           "atomic_write", "atomic_write_text"]
