"""Any shape, any strategy, exactly once (issue 36 item 1) with real ranks: a script using ``DistributedLoader``
and ``rt.resume``/``rt.checkpoint`` is stopped at a random mid-epoch step on S ranks under one strategy and
resumed on R ranks under another of ddp, zero1 and fsdp (DCP reshards the sharded state). The parameters the resumed run starts from are the ones
saved, bit for bit, and every sample of each epoch is trained once (sample-id logs of every rank). The data
cursor itself, for every S, R in 1..4 and 20 seeds of three interruptions: tests/unit/test_data_cursor.py."""

from __future__ import annotations

import collections
import random

import pytest

from helpers.cli import in_process as trainscale

N, BATCH = 120, 4

SCRIPT = '''
import hashlib, os
import torch
from torch import nn
import trainscale
from trainscale.data import DistributedLoader
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

class Ids(torch.utils.data.Dataset):
    def __len__(self):
        return %(n)d
    def __getitem__(self, i):
        return torch.tensor([float(i), 1.0]), i

def digest(model):
    """Every parameter, whole (a collective for fsdp), as one hash."""
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return hashlib.sha256(b"".join(full[k].detach().contiguous().numpy().tobytes() for k in sorted(full))).hexdigest()

stop = int(os.environ.get("STOP_AT", "0"))
with trainscale.init(seed=0) as rt:
    model, optimizer = rt.setup(nn.Sequential(nn.Linear(2, 8), nn.Linear(8, 1)),
                                lambda p: torch.optim.Adam(p, lr=1e-2), strategy=os.environ["STRATEGY"])
    loader = DistributedLoader.for_runtime(Ids(), rt, batch_size=%(batch)d)
    step = rt.resume(model, optimizer, loader=loader)
    if step:
        hashed = digest(model)
        if rt.rank == 0:
            open("resumed.txt", "w").write(hashed)
    seen = open(f"seen-{os.environ['ATTEMPT']}-rank{rt.rank}.txt", "w")
    while loader.state_dict()["epoch"] < 2:
        epoch = loader.state_dict()["epoch"]
        for x, ids in loader:
            model(x).pow(2).mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            step += 1
            seen.write(" ".join(f"{epoch}:{i}" for i in ids.tolist()) + "\\n")
            seen.flush()
            if step == stop:
                rt.checkpoint(step, model, optimizer, every=stop, loader=loader)
                hashed = digest(model)
                if rt.rank == 0:
                    open("saved.txt", "w").write(hashed)
                raise SystemExit(3)  # the node is lost right after the checkpoint
''' % {"n": N, "batch": BATCH}


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("strategy, saved, then, resumed", [("ddp", 2, "fsdp", 3), ("fsdp", 3, "zero1", 2),
                                                             ("zero1", 2, "ddp", 1), ("fsdp", 2, "fsdp", 1)])
def test_a_script_stopped_mid_epoch_on_s_ranks_resumes_on_r_ranks_every_sample_once(tmp_path, strategy, saved,
                                                                                    then, resumed):
    (tmp_path / "train.py").write_text(SCRIPT)
    steps_per_epoch = N // saved // BATCH
    stop = random.Random(f"{strategy}{saved}{resumed}").randrange(steps_per_epoch + 1, 2 * steps_per_epoch)
    env = {"STRATEGY": strategy, "ATTEMPT": "0", "STOP_AT": str(stop)}
    first = trainscale("run", "--nproc-per-node", str(saved), "--log-dir", "logs", "train.py", cwd=tmp_path, env=env)
    assert first.returncode == 1 and "exit code 3" in first.stderr, first.stdout + first.stderr
    second = trainscale("run", "--nproc-per-node", str(resumed), "--log-dir", "logs", "train.py", cwd=tmp_path,
                        env={**env, "STRATEGY": then, "ATTEMPT": "1", "STOP_AT": "0"})
    assert second.returncode == 0, second.stdout + second.stderr
    assert f"resumed from checkpoints/ckpt-{stop:08d}" in second.stdout, second.stdout
    assert (tmp_path / "resumed.txt").read_text() == (tmp_path / "saved.txt").read_text()  # the saved weights

    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for attempt, ranks in ((0, saved), (1, resumed)):
        for rank in range(ranks):
            for item in (tmp_path / f"seen-{attempt}-rank{rank}.txt").read_text().split():
                epoch, sample = item.split(":")
                counts[epoch][int(sample)] += 1
    assert set(counts) == {"0", "1"}
    for epoch, seen in counts.items():
        assert set(seen.values()) == {1}, f"epoch {epoch}: trained twice: {[s for s, c in seen.items() if c > 1]}"
    # epoch 0 ran whole on S ranks; epoch 1 was split at the stop: what is left untrained is less than one step of
    # the shape that ended it (drop_last, as torch's DistributedSampler and DataLoader have it)
    assert len(counts["0"]) == N // (saved * BATCH) * saved * BATCH
    assert N - len(counts["1"]) < resumed * BATCH + resumed, N - len(counts["1"])


def test_a_checkpoint_of_another_model_is_refused_by_name_never_loaded(tmp_path):
    """cnn's checkpoint under vit: one line naming the file and why, no traceback, under a replica strategy and
    under a sharded one (whose optimizer state is matched by parameter name)."""
    fast = ["--data", "synthetic", "--samples", "64", "--batch-size", "16", "--log-every", "0"]
    made = trainscale("run", "--nproc-per-node", "1", "--log-dir", "logs", "--workload", "cnn", *fast, "--max-steps",
                      "1", "--checkpoint-dir", "c", cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    for strategy, said in (("ddp", "holds another model's state: its parameters are not this model's"),
                           ("fsdp", "holds the optimizer state of 8 parameters; this model's optimizer has")):
        other = trainscale("run", "--nproc-per-node", "1", "--log-dir", "logs", "--workload", "vit", *fast,
                           "--strategy", strategy, "--max-steps", "2", "--checkpoint-dir", "c", cwd=tmp_path)
        assert other.returncode == 1 and said in other.stderr, other.stderr[-2000:]
        assert "Traceback" not in other.stdout + other.stderr
