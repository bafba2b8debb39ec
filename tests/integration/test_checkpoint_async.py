"""Background checkpoints on real gloo ranks: a failed background save fails every rank naming the
path; DCP's background part talks only over its own process group; through `trainscale run`, a
background save writes the same bytes as a synchronous one (ddp's rank-0 file, fsdp's shards), a
rank killed while one is in flight leaves the previous checkpoint the newest and the rerun ends
bitwise where a synchronous run ends; asking for it where it cannot be done is refused before launch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from helpers.cli import in_process
from helpers.multiproc import run_on_ranks
from integration.test_strategies import batches, mlp
from torch import nn
from torch.utils._pytree import tree_flatten

from trainscale.checkpoint import find_latest, layout, list_checkpoints
from trainscale.cli.main import main

FAST_CNN = ["--workload", "cnn", "--data", "synthetic", "--samples", "256", "--batch-size", "16", "--log-every", "0"]
SAVES_AT_2_4_6 = [
    "run",
    "--nproc-per-node",
    "2",
    "--log-dir",
    "logs",
    *FAST_CNN,
    "--max-steps",
    "6",
    "--checkpoint-every",
    "2",
]


# ------------------------------------------------------------------------------- Checkpointer on 2 ranks
def failing_background_saves(root: str) -> dict:
    """A rank-0 file whose background write fails on rank 0, then DCP shards whose write fails on rank 1."""
    from torch.distributed.checkpoint import FileSystemWriter

    import trainscale
    from trainscale.checkpoint import Checkpointer
    from trainscale.errors import CheckpointError
    from trainscale.strategies import get_strategy
    from trainscale.strategies.base import OptimizerSpec

    out = {}
    with trainscale.init(seed=0) as rt:
        ck = Checkpointer(Path(root) / "file", rt, asynchronous=True)
        ck.save(1, {"w": torch.ones(3)})
        ck.wait()
        real_save = torch.save
        if rt.rank == 0:

            def disk_full(*args, **kwargs):
                raise OSError(28, "No space left on device (injected)")

            torch.save = disk_full
        ck.save(2, {"w": torch.zeros(3)})
        try:
            ck.wait()
        except CheckpointError as exc:
            out["file"] = str(exc)
        torch.save = real_save
        out["file_latest"] = ck.latest().step
        ck.close()

        strategy = get_strategy("fsdp")
        model, opt = strategy.wrap(mlp(), OptimizerSpec(torch.optim.Adam, {"lr": 1e-2}), rt)
        ck = Checkpointer(Path(root) / "dcp", rt, strategy=strategy, asynchronous=True)
        ck.save(2, {"model": strategy.checkpoint_state(model, opt), "step": 2})
        ck.wait()
        real_write = FileSystemWriter.write_data
        if rt.rank == 1:

            def broken(self, plan, planner):
                raise OSError("disk full (injected)")

            FileSystemWriter.write_data = broken
        ck.save(4, {"model": strategy.checkpoint_state(model, opt), "step": 4})
        try:
            ck.wait()
        except CheckpointError as exc:
            out["dcp"] = str(exc)
        FileSystemWriter.write_data = real_write
        rt.barrier()
        out["dcp_latest"] = ck.latest().step
        ck.close()
    return out


@pytest.mark.slow
def test_a_failed_background_save_fails_every_rank_naming_the_path(tmp_path):
    results = run_on_ranks(failing_background_saves, 2, str(tmp_path))
    rank0, rank1 = results[0], results[1]
    assert (
        "background save of step 2 to" in rank0["file"] and "ckpt-00000002.pt failed: the disk holding" in rank0["file"]
    )
    assert "--no-checkpoint-async" in rank0["file"]
    assert "failed on rank(s) 0" in rank1["file"]  # rank 1 wrote nothing, and still stops
    assert rank0["file_latest"] == rank1["file_latest"] == 1
    for result in (rank0, rank1):  # DCP reports rank 1's failure on every rank
        assert "saving the sharded checkpoint of step 4 failed: rank 1: OSError: disk full (injected)" in result["dcp"]
        assert result["dcp_latest"] == 2
    assert not (tmp_path / "dcp" / "ckpt-00000004").exists()


COLLECTIVES = (
    "gather_object",
    "all_gather_object",
    "scatter_object_list",
    "broadcast_object_list",
    "barrier",
    "all_reduce",
    "all_gather",
    "broadcast",
)


def background_collectives(root: str) -> list[tuple[str, str]]:
    """Train and save fsdp shards in the background; (thread, group) of every collective DCP's
    background part issued, group 'default' when it used the training's process group."""
    import torch.distributed as dist

    import trainscale
    from trainscale.checkpoint import Checkpointer
    from trainscale.strategies import get_strategy
    from trainscale.strategies.base import OptimizerSpec

    seen: list[tuple[str, str]] = []

    def spy(name, real):
        def collective(*args, **kwargs):
            if threading.current_thread() is not threading.main_thread():
                group = kwargs.get("group")
                seen.append(
                    (
                        threading.current_thread().name,
                        "default" if group is None or group is dist.group.WORLD else dist.get_backend(group),
                    )
                )
            return real(*args, **kwargs)

        return collective

    for name in COLLECTIVES:
        setattr(dist, name, spy(name, getattr(dist, name)))
    with trainscale.init(seed=0) as rt:
        strategy = get_strategy("fsdp")
        model, opt = strategy.wrap(mlp(), OptimizerSpec(torch.optim.Adam, {"lr": 1e-2}), rt)
        ck = Checkpointer(root, rt, strategy=strategy, asynchronous=True)
        for step, (x, y) in enumerate(batches(rt.rank, rt.world_size), start=1):
            strategy.backward_loss(nn.functional.cross_entropy(model(x), y), model)  # all-gathers, reduce-scatters
            strategy.micro_step(opt, model, last=True)
            ck.save(step, {"model": strategy.checkpoint_state(model, opt), "step": step})
        ck.wait()
        ck.close()
        assert ck.latest().step == step
    return seen


@pytest.mark.slow
def test_dcp_background_saves_never_use_the_training_process_group(tmp_path):
    for rank, seen in run_on_ranks(background_collectives, 2, str(tmp_path)).items():
        assert seen, "DCP's background part issued no collective: the spy saw nothing"
        assert {group for _, group in seen} == {"gloo"}, (rank, seen)
        assert all(thread != "MainThread" for thread, _ in seen)


# ------------------------------------------------------------------------------- through `trainscale run`
CLEAN = ("RANK", "WORLD_SIZE", "MASTER_", "SLURM_", "TRAINSCALE_")
"""Variables a launch here starts without."""


def trainscale(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return in_process(*args, cwd=cwd, drop=CLEAN)


def _env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith(CLEAN)}, **extra}


def contents(path: Path, scratch: Path) -> dict:
    """Everything a checkpoint holds, as plain tensors and values (a DCP directory converted to one file)."""
    if path.is_file():
        return torch.load(path, weights_only=True)
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    single = scratch / f"{path.parent.name}-{path.name}.pt"
    dcp_to_torch_save(path, single)
    shards = torch.load(single, weights_only=False)  # our own test files
    marker = json.loads((path / layout.MARKER).read_text())
    # The manifest's hashes differ from save to save: DCP's .metadata records the save's own path and id.
    return {
        **shards,
        **torch.load(path / layout.EXTRA, weights_only=True),
        "marker": {k: v for k, v in marker.items() if k not in ("files", "digest")},
    }


def assert_same(a, b, what: str) -> None:
    flat_a, spec_a = tree_flatten(a)
    flat_b, spec_b = tree_flatten(b)
    assert spec_a == spec_b, f"{what}: different structure"
    for x, y in zip(flat_a, flat_b):
        assert torch.equal(x, y) if torch.is_tensor(x) else x == y, f"{what}: {x!r} != {y!r}"


def _read_when_written(fifo: Path, proc: subprocess.Popen) -> str:
    """The line a held background save writes into ``fifo``; '' when the run ended first."""
    line: list[str] = []
    reader = threading.Thread(target=lambda: line.append(fifo.read_text()), daemon=True)
    reader.start()
    while reader.is_alive() and proc.poll() is None:
        reader.join(timeout=0.5)
    if reader.is_alive():  # the run ended without reaching the hold: let the reader go
        with open(fifo, "w"):
            pass
        reader.join()
        return ""
    return line[0]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])  # a rank-0 file, DCP shards
def test_background_saves_hold_the_synchronous_bytes_and_a_rank_killed_during_one_resumes_bitwise(tmp_path, strategy):
    args = [*SAVES_AT_2_4_6, "--strategy", strategy]
    runs = {}
    for name, flag in (("background", []), ("sync", ["--no-checkpoint-async"])):
        done = trainscale([*args, *flag, "--checkpoint-dir", name, "--metrics-out", f"{name}.json"], tmp_path)
        assert done.returncode == 0, done.stderr
        metrics = json.loads((tmp_path / f"{name}.json").read_text())
        runs[name] = metrics
        assert len(metrics["checkpoint_stall_s"]) == 3 and all(s > 0 for s in metrics["checkpoint_stall_s"])
    assert runs["background"]["checkpoint_async"] is True and runs["sync"]["checkpoint_async"] is False
    background, sync = list_checkpoints(tmp_path / "background"), list_checkpoints(tmp_path / "sync")
    assert [s for s, _ in background] == [s for s, _ in sync] == [6, 4]  # kept 2, nothing partial left
    assert not list(layout.leftovers(tmp_path / "background"))
    for (step, ours), (_, theirs) in zip(background, sync):
        assert_same(contents(ours, tmp_path), contents(theirs, tmp_path), f"{strategy} step {step}")

    # rank 0 SIGKILLed while its background save of step 4 is in flight
    fifo = tmp_path / "hold.fifo"
    os.mkfifo(fifo)
    killed = tmp_path / "killed"
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainscale", *args, "--checkpoint-dir", str(killed)],
        cwd=tmp_path,
        env=_env(TRAINSCALE_CHECKPOINT_HOLD=f"4:{fifo}"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    held = _read_when_written(fifo, proc)
    if not held:
        out, err = proc.communicate(timeout=60)
        pytest.fail(f"the save of step 4 was never held:\n{out}\n{err}")
    pid, step = map(int, held.split())
    assert step == 4
    os.kill(pid, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert list(layout.leftovers(killed)), "the save of step 4 had written nothing yet"
    assert not list(killed.glob("ckpt-00000004*"))
    found = find_latest(killed)
    assert found is not None and found.step == 2
    rerun = trainscale([*args, "--checkpoint-dir", str(killed)], tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert "Resumed from" in rerun.stdout and "at step 2 " in rerun.stdout
    assert not list(layout.leftovers(killed))  # the rerun's saves swept what the killed one left
    resumed, reference = list_checkpoints(killed)[0], sync[0]  # the uninterrupted synchronous run's step 6
    assert resumed[0] == reference[0] == 6
    assert_same(contents(resumed[1], tmp_path), contents(reference[1], tmp_path), f"{strategy} resumed vs clean")


def test_checkpoint_async_where_it_cannot_be_done_is_refused_before_any_process_starts(in_tmp, capsys):
    code = main(
        [
            "run",
            "--log-dir",
            "logs",
            "--nproc-per-node",
            "2",
            "--workload",
            "cnn",
            "--strategy",
            "deepspeed",
            "--checkpoint-async",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "engine writes its own checkpoint files" in err and "--no-checkpoint-async" in err
    assert not (in_tmp / "logs").exists()
