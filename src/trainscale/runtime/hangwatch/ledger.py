"""This rank's ledger of collectives, read from what torch keeps anyway: how many each process group has
issued (its sequence number), and which are still in flight — their op, sizes and the Python frame that
issued them — from torch's flight recorders: gloo's and other CPU backends' (torch >= 2.8) and NCCL's, which is
a recorder of its own with a dump of its own. Without a flight record, where the main thread stands says which
collective it waits in. trainscale's own background groups (checkpoint/background.py's, named
``trainscale-...``) are left out: their collectives run on a worker thread at each rank's own pace. Also: where
a thread is (its innermost frame of the user's code), and every thread's stack. Read by the heartbeat
(runtime/hangwatch/heartbeat.py). The one thing it adds: :func:`record_sites`, where each collective called from
Python was issued, kept by the calling thread at the call (the flight recorder's own stack traces cost a
second's imports to read, on the watching thread).
"""

from __future__ import annotations

import functools
import inspect
import io
import os
import pickle
import sys
import sysconfig
import threading
import time
import traceback
import weakref
from typing import Any

import torch
import torch.distributed as dist

FR_BUFFER_VARS = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
"""The flight recorder's size, newest name first (torch >= 2.7 reads both and warns about the second)."""
FR_ENTRIES = "2000"
"""torch's documented default size of the flight recorder (a ring of collectives per rank)."""
OWN_GROUP = "trainscale-"
"""How trainscale's own background process groups are described (``group_desc``)."""
_PACKAGE = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # trainscale/
_SKIP = (
    os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
    sysconfig.get_paths()["stdlib"] + os.sep,
    *(os.path.join(_PACKAGE, part) + os.sep for part in ("runtime", "observe", "launch", "strategies")),
)
"""Where a frame is machinery, not the place a user would look: torch, the standard library, trainscale's
runtime, recorder, bootstrap and strategies (a built-in workload's loop is its code)."""
_OWN = tuple(os.path.join(_PACKAGE, part) + os.sep for part in ("runtime", "observe"))

_CHANNELS: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
_CHANNEL_GROUPS: dict[str, weakref.ref] = {}


def enable_flight_recorder(environ: Any = os.environ) -> None:
    """Keep the last collectives of every process group, gloo's too (before the group exists): torch's
    documented size under the one name this torch reads first; a size the user gave under either name wins."""
    if any(environ.get(name) for name in FR_BUFFER_VARS):
        return
    major, minor = (int(part) for part in torch.__version__.split(".")[:2])
    environ[FR_BUFFER_VARS[0] if (major, minor) >= (2, 7) else FR_BUFFER_VARS[1]] = FR_ENTRIES


_COLLECTIVES = (
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "gather",
    "gather_object",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
)
"""torch.distributed's collectives a script, FSDP2 or ZeRO calls from Python (DDP's gradient all-reduces are
issued in C++: no site of their own, nor needed: every rank issues them alike)."""
_SITE_SLOTS = int(FR_ENTRIES)
_sites: dict[str, list[Any]] = {}
"""Process group name -> a ring of (sequence number, op, frames) by sequence number: where it was issued (op: the
function's name where the call issued one collective, else None)."""
_last: dict[str, int] = {}
"""Process group name -> the last sequence number placed: one that goes back is a new group of that name."""
_SITE_DEPTH = 24
"""Frames looked through for a collective's place, innermost first: a script's own collective is placed at
once, a library's (HF's Trainer, DeepSpeed) past its own frames; deeper, none (the main thread's frame places a
collective still in flight)."""
_MACHINERY_DEPTH = 4
"""Frames of torch's (or trainscale's) own looked through before the first outside them: a collective issued
deeper in torch (FSDP's all-gathers from its hooks, 887 bytecodes a call to walk 20 frames) is issued alike by
every rank, and left unplaced."""
_KINDS: dict[Any, int] = {}
"""A code object's kind for :func:`_note_site`, asked once: 0 machinery (torch, the standard library,
trainscale's), 1 a library's, 2 the user's own."""


def record_sites() -> Any:
    """Where each collective called from Python is issued: torch.distributed's functions wrapped (one frame walk
    and two reads of the group's sequence number a call), so that a collective already done (gloo completes a
    rank's extra all-reduce against the others' next one, and the rank goes on) is still placed. Returns what
    undoes it."""
    c10d, undo = dist.distributed_c10d, []
    for name in _COLLECTIVES:
        original = getattr(c10d, name, None)
        if original is None or getattr(original, "_trainscale_sited", False):  # none, or placed already
            continue
        try:
            position = list(inspect.signature(original).parameters).index("group")
        except ValueError:
            position = None
        wrapped = _sited(original, position)
        for module in (c10d, dist):
            if getattr(module, name, None) is original:
                setattr(module, name, wrapped)
                undo.append((module, name, original))
    return lambda: [setattr(module, name, original) for module, name, original in undo]


def _sited(original: Any, position: int | None) -> Any:
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", lambda: False)

    @functools.wraps(original)
    def issued(*args: Any, **kwargs: Any) -> Any:
        if compiling():  # traced by torch.compile: the collective as torch's tracer knows it (no frame walk there)
            return original(*args, **kwargs)
        group = kwargs.get("group") if position is None or len(args) <= position else args[position]
        try:
            group = group if group is not None else dist.distributed_c10d._get_default_group()
            before = group._get_sequence_number_for_group()
        except Exception:  # no group yet, a group given another way (a mesh): no site, the call as it is
            return original(*args, **kwargs)
        try:
            return original(*args, **kwargs)
        finally:
            _note_site(group, before, sys._getframe(1), original.__name__)

    issued._trainscale_sited = True
    return issued


def _note_site(group: Any, before: int, frame: Any, op: str) -> None:
    try:
        after, name = group._get_sequence_number_for_group(), group.group_name
    except Exception:
        return
    if after <= before:  # none issued on its default backend (a CPU tensor on a GPU group's gloo): no place known
        return
    frames: list[tuple[Any, int]] = []  # (code, line): the first outside torch, and the user's own past a library's
    depth = 0
    while frame is not None and depth < _SITE_DEPTH:
        code = frame.f_code
        kind = _KINDS.get(code)
        if kind is None:
            kind = _KINDS[code] = 2 if _own_code(code.co_filename) else int(_user_frame(code.co_filename))
        if kind and (kind == 2 or not frames):
            frames.append((code, frame.f_lineno))
            if kind == 2:
                break
        elif not frames and depth >= _MACHINERY_DEPTH:  # deep in torch's own (FSDP's hooks): every rank's alike
            break
        frame, depth = frame.f_back, depth + 1
    ring = _sites.get(name)
    if ring is None or after < _last.get(name, 0):  # a group of that name made again: its numbers start over
        ring = _sites[name] = [None] * _SITE_SLOTS
    _last[name] = after
    one = op if after - before == 1 else None
    for seq in range(before + 1, min(after, before + _SITE_SLOTS) + 1):
        ring[seq % _SITE_SLOTS] = (seq, one, frames)


def issued_at(group: str, seq: int, op: str | None = None) -> str | None:
    """Where collective ``seq`` of process group ``group`` (its name) was issued on this rank, or None; with
    ``op`` (the flight recorder's), only where the call that issued it was that collective."""
    ring = _sites.get(group)
    slot = ring[seq % _SITE_SLOTS] if ring is not None else None
    if slot is None or slot[0] != seq or not slot[2]:
        return None
    if op is not None and slot[1] is not None and not _same_op(op, slot[1]):
        return None
    return site_of_frames([{"filename": c.co_filename, "line": line, "name": c.co_name} for c, line in slot[2]])


def _same_op(recorded: str, called: str) -> bool:
    """Whether the flight recorder's ``recorded`` (``gloo:all_reduce``) is the collective Python ``called``."""
    mine, theirs = _bare(called), _bare(recorded)
    return mine == theirs or (mine == "barrier" and theirs == "allreduce" and recorded.startswith("nccl"))


def _bare(op: str) -> str:
    bare = op.rsplit(":", 1)[-1].replace("_", "").lower()
    return _SAME_OP.get(bare, bare)


_SAME_OP = {  # the flight recorder's names for what Python calls these (NCCL's barrier: an all-reduce)
    "allgatherbase": "allgatherintotensor",
    "reducescatterbase": "reducescattertensor",
    "alltoallbase": "alltoallsingle",
}


def track(name: str, channel: Any, group: dist.ProcessGroup) -> None:
    """Count ``channel.collectives`` (an int that every rank's copy raises alike per collective) among this
    rank's issued collectives while ``group``, the process group whose ranks share it, lives: for collectives
    that do not go through a process group (``comm_hook=shm``)."""
    _CHANNEL_GROUPS[name] = weakref.ref(group)
    _CHANNELS[name] = channel


def _groups() -> list[tuple[Any, str]]:
    try:
        return list(dist.distributed_c10d._world.pg_names.items())
    except (AttributeError, RuntimeError):  # another thread is creating a group: next beat
        return []


def _own(desc: Any) -> bool:
    return str(desc or "").startswith(OWN_GROUP)


def own_groups() -> dict[str, str]:
    """trainscale's own background groups ("pg:NAME" -> their description), which :func:`issued` and
    :func:`recent` leave out."""
    return {
        f"pg:{name}": str(getattr(group, "group_desc", ""))
        for group, name in _groups()
        if _own(getattr(group, "group_desc", ""))
    }


def issued() -> dict[str, int]:
    """Collectives this rank has issued so far: per process group (torch's sequence number, raised when a
    collective is issued, before it completes; trainscale's own background groups left out) and per tracked
    channel."""
    out: dict[str, int] = {}
    groups = _groups()
    for group, name in groups:
        try:
            if not _own(getattr(group, "group_desc", "")):
                out[f"pg:{name}"] = int(group._get_sequence_number_for_group())
        except (AttributeError, RuntimeError, ValueError):
            continue
    alive = {id(group) for group, _ in groups}
    for name, channel in list(_CHANNELS.items()):
        ref = _CHANNEL_GROUPS.get(name)
        group = ref() if ref is not None else None
        if group is not None and id(group) in alive:
            out[name] = int(getattr(channel, "collectives", 0))
    return out


_DUMPS = (("_dump_fr_trace", False), ("_dump_nccl_trace", True))
"""torch's flight recorders, each with a dump of its own, and whether to ask it for what is in flight only:
gloo's and other CPU backends' (everything it keeps: a collective another rank called differently shows there
even when gloo let one side complete it), and ProcessGroupNCCL's."""


def _entries() -> list[tuple[dict[str, Any], bool]] | None:
    """(entry, from NCCL's recorder) of every flight recorder, point-to-point ones and trainscale's own groups'
    left out; None where none holds any (an empty dump is no record: the recorder of a backend this job does not
    use, or one switched off)."""
    found = []
    for name, only_active in _DUMPS:
        dump = getattr(torch._C._distributed_c10d, name, None)
        if dump is None:
            continue
        try:
            try:
                raw = dump(includeCollectives=True, includeStackTraces=False, onlyActive=only_active)
            except TypeError:  # a torch whose binding takes them by position only
                raw = dump(True, False, only_active)
            entries = _PlainData(io.BytesIO(raw)).load().get("entries") or ()
        except Exception:
            continue
        found += [
            (entry, only_active)
            for entry in entries
            if not entry.get("is_p2p") and not _own((tuple(entry.get("process_group") or ()) + ("", ""))[1])
        ]
    return found or None


def recent(limit: int = 8, frame: Any = None) -> list[dict[str, Any]] | None:
    """This rank's last ``limit`` collectives per process group, oldest first, from torch's flight recorders:
    {"pg", "seq", "op", "sizes", "site", "age_s", "done"} (``done``: completed here). None where torch keeps no
    flight record (then :func:`waiting_in` tells where the main thread waits). On NCCL a rank waits for its
    collective in a CUDA synchronisation (``.item()``, ``synchronize``), not in torch.distributed: the record
    says the collective is still in flight, and ``frame`` where the rank waits.

    The dump is asked for without its stack traces: symbolising them imports some 800 modules (torch._dynamo
    among them) the first time, and an import from this thread while the script's main thread imports the same
    modules leaves one of them half-initialised there (seen: DDP's constructor failing in a loaded job). Where
    a collective is still in flight, the main thread's ``frame`` says where the rank waits for it; one already
    done is placed where :func:`record_sites` saw it issued."""
    entries = _entries()
    if entries is None:
        return None
    now = time.time_ns()
    waits_in = waiting_in(frame) if frame is not None else None
    where = site(frame) if frame is not None else None
    per_group: dict[str, list[dict[str, Any]]] = {}
    for entry, nccl in entries:
        group = entry.get("process_group") or ("?",)
        op = str(entry.get("profiling_name") or "?").split(":", 1)[-1]
        # NCCL's: completed on the GPU (retired without that: its watchdog let it go); gloo's: retired
        done = entry.get("state") == "completed" or (not nccl and bool(entry.get("retired")))
        if not done and waits_in == "backward":
            op += " in backward (DDP's gradient all-reduce)" if op == "all_reduce" else " in backward"
        seq = int(entry.get("collective_seq_id") or 0)
        issued = issued_at(str(group[0]), seq, str(entry.get("profiling_name") or "") or None)
        per_group.setdefault(f"pg:{group[0]}", []).append(
            {
                "pg": f"pg:{group[0]}",
                "seq": seq,
                "op": op,
                "sizes": entry.get("input_sizes"),
                "site": issued or (None if done else where),
                "age_s": round(max(0.0, (now - int(entry.get("time_created_ns") or now)) / 1e9), 2),
                "done": done,
            }
        )
    out = [e for group in per_group.values() for e in sorted(group, key=lambda e: e["seq"])[-limit:]]
    out.sort(key=lambda e: (e["pg"], e["seq"]))
    return out


class _PlainData(pickle.Unpickler):
    """The flight recorder's dump is a pickle of plain dicts, lists and strings (torch's own bytes, from this
    process): read it admitting no class at all (docs/security.md)."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the flight recorder's dump names {module}.{name}: refused")


def waiting_in(frame: Any) -> str | None:
    """The collective a thread waits in, from its frames alone (no flight recorder): a torch.distributed
    call, or backward (DDP's gradient all-reduce is waited for at its end); None elsewhere."""
    while frame is not None:
        path = frame.f_code.co_filename
        if path.endswith(os.path.join("distributed", "distributed_c10d.py")) and not frame.f_code.co_name.startswith(
            "_"
        ):
            return frame.f_code.co_name
        if frame.f_code.co_name == "_engine_run_backward":
            return "backward"
        frame = frame.f_back
    return None


def _user_frame(path: str) -> bool:
    return not (path.startswith(_SKIP) or path.startswith("<"))


def _own_code(path: str) -> bool:
    return _user_frame(path) and "site-packages" not in path and "dist-packages" not in path


def describe(path: str, line: int, name: str) -> str:
    return f"{os.path.relpath(path) if not os.path.relpath(path).startswith('..') else path}:{line} in {name}"


def site_of_frames(frames: list[dict[str, Any]]) -> str | None:
    """Where a collective was issued (flight-recorder frames, innermost first): the innermost frame outside
    torch, and the innermost of the user's own files where that one is a library's (HF's Trainer)."""
    outer = next((f for f in frames if _user_frame(str(f.get("filename", "")))), None)
    if outer is None:
        return None
    text = describe(str(outer["filename"]), int(outer.get("line", 0)), str(outer.get("name", "?")))
    if not _own_code(str(outer["filename"])):
        own = next((f for f in frames if _own_code(str(f.get("filename", "")))), None)
        if own is not None:
            text += f", from {describe(str(own['filename']), int(own.get('line', 0)), str(own.get('name', '?')))}"
    return text


def site(frame: Any) -> str | None:
    """Where a thread is: its innermost frame outside torch, the standard library and trainscale (the
    innermost frame itself when there is none), and the user's own file where that is a library's."""
    frames = []
    while frame is not None:
        frames.append({"filename": frame.f_code.co_filename, "line": frame.f_lineno, "name": frame.f_code.co_name})
        frame = frame.f_back
    while frames and frames[0]["filename"].startswith(_OWN):  # this module's own look at the thread
        frames.pop(0)
    found = site_of_frames(frames)
    if found is None and frames:
        return describe(frames[0]["filename"], frames[0]["line"], frames[0]["name"])
    if found is not None and frames and frames[0]["filename"] != found.split(":")[0]:
        inner = frames[0]
        if not _user_frame(inner["filename"]):  # waiting in a library call: say which
            found = f"{found} (in {os.path.basename(inner['filename'])}:{inner['line']} {inner['name']})"
    return found


def main_frame() -> Any:
    return sys._current_frames().get(threading.main_thread().ident)


_LAUNCH = (os.path.join(_PACKAGE, "launch", "bootstrap.py"), "<frozen runpy>")


def stacks(limit_chars: int = 6000, frames: int = 14) -> str:
    """Every thread's Python stack, innermost last, trainscale's own threads and the bootstrap's frames left
    out (the main thread first)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    parts = []
    for ident, frame in sorted(sys._current_frames().items(), key=lambda item: item[0] != main):
        name = names.get(ident, f"thread {ident}")
        if name.startswith("trainscale-") or ident == threading.get_ident():
            continue
        summary = [f for f in traceback.extract_stack(frame) if f.filename not in _LAUNCH]
        text = "".join(traceback.format_list(summary[-frames:])).rstrip()
        parts.append(f"Thread {name}{' (main)' if ident == main else ''}:\n{text}")
    out = "\n".join(parts)
    return out if len(out) <= limit_chars else out[:limit_chars] + "\n..."
