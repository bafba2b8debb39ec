"""Any shape, any strategy, exactly once (issue 36 item 1) with real ranks: a script using ``DistributedLoader``
and ``rt.resume``/``rt.checkpoint`` is stopped at a random mid-epoch step on S ranks under one strategy and
resumed on R ranks under another of ddp, zero1 and fsdp (DCP reshards the sharded state). The parameters the resumed
run starts from are the ones
saved, bit for bit, and every sample of each epoch is trained once (sample-id logs of every rank). The whole
matrix S, R in 1..4 x ddp, zero1, fsdp (each saved checkpoint resumed under every strategy) with real ranks, four
save launches and four resume launches; the data cursor through 20 seeds of three interruptions on random shapes
(in one process: what is handed out depends on the cursor alone): tests/unit/test_data_cursor.py."""

from __future__ import annotations

import collections
import os
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
    """Every parameter, whole (a collective for fsdp), as one hash: rank 0's (cpu_offload leaves the others none)."""
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
@pytest.mark.parametrize(
    "strategy, saved, then, resumed",
    [("ddp", 2, "fsdp", 3), ("fsdp", 3, "zero1", 2), ("zero1", 2, "ddp", 1), ("fsdp", 2, "fsdp", 1)],
)
def test_a_script_stopped_mid_epoch_on_s_ranks_resumes_on_r_ranks_every_sample_once(
    tmp_path, strategy, saved, then, resumed
):
    (tmp_path / "train.py").write_text(SCRIPT)
    steps_per_epoch = N // saved // BATCH
    stop = random.Random(f"{strategy}{saved}{resumed}").randrange(steps_per_epoch + 1, 2 * steps_per_epoch)
    env = {"STRATEGY": strategy, "ATTEMPT": "0", "STOP_AT": str(stop)}
    first = trainscale("run", "--nproc-per-node", str(saved), "--log-dir", "logs", "train.py", cwd=tmp_path, env=env)
    assert first.returncode == 1 and "exit code 3" in first.stderr, first.stdout + first.stderr
    second = trainscale(
        "run",
        "--nproc-per-node",
        str(resumed),
        "--log-dir",
        "logs",
        "train.py",
        cwd=tmp_path,
        env={**env, "STRATEGY": then, "ATTEMPT": "1", "STOP_AT": "0"},
    )
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
    made = trainscale(
        "run",
        "--nproc-per-node",
        "1",
        "--log-dir",
        "logs",
        "--workload",
        "cnn",
        *fast,
        "--max-steps",
        "1",
        "--checkpoint-dir",
        "c",
        cwd=tmp_path,
    )
    assert made.returncode == 0, made.stderr
    for strategy, said in (
        ("ddp", "holds another model's state: its parameters are not this model's"),
        ("fsdp", "holds the optimizer state of 8 parameters; this model's optimizer has"),
    ):
        other = trainscale(
            "run",
            "--nproc-per-node",
            "1",
            "--log-dir",
            "logs",
            "--workload",
            "vit",
            *fast,
            "--strategy",
            strategy,
            "--max-steps",
            "2",
            "--checkpoint-dir",
            "c",
            cwd=tmp_path,
        )
        assert other.returncode == 1 and said in other.stderr, other.stderr[-2000:]
        assert "Traceback" not in other.stdout + other.stderr


# -- the whole matrix with real ranks: S, R in 1..4 x ddp, zero1, fsdp ------------------------------------------
# One launch per S saves a checkpoint under each strategy at a random mid-epoch step of epoch 1; one launch per R
# resumes every one of them (4 shapes x 3 strategies) under each strategy. 240 samples, 2 per rank and step: the
# stop is a multiple of 24 samples, so what is left of the epoch splits over any R in 1..4 with no drop_last tail,
# and "every sample once" is exact.
MATRIX_N, MATRIX_BATCH, STRATEGIES = 240, 2, ("ddp", "zero1", "fsdp")


def matrix_stop(saved: int, strategy: str) -> int:
    """Steps into epoch 1 at which S ranks stop: k*S*2 samples, a multiple of 24, somewhere mid-epoch."""
    consumed = 24 * random.Random(f"{saved}{strategy}").randrange(1, MATRIX_N // 24)
    return consumed // (saved * MATRIX_BATCH)


def _matrix_parts(rt, strategy: str):
    import torch
    from torch import nn

    from trainscale.data import DistributedLoader

    class Ids(torch.utils.data.Dataset):
        def __len__(self):
            return MATRIX_N

        def __getitem__(self, i):
            return torch.tensor([float(i), 1.0]), i

    torch.manual_seed(0)
    model, optimizer = rt.setup(
        nn.Sequential(nn.Linear(2, 8), nn.Linear(8, 1)), lambda p: torch.optim.Adam(p, lr=1e-2), strategy=strategy
    )
    return model, optimizer, DistributedLoader.for_runtime(Ids(), rt, batch_size=MATRIX_BATCH)


def _digest(model) -> str:
    """The whole weights as one hash, on rank 0 (a collective for fsdp; cpu_offload leaves the others none)."""
    import hashlib

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return hashlib.sha256(b"".join(full[k].detach().contiguous().numpy().tobytes() for k in sorted(full))).hexdigest()


def save_on_s_ranks(root: str) -> dict:
    """Each strategy: epoch 0 whole, then the stop's steps of epoch 1, a checkpoint; the ids trained in epoch 1."""
    from pathlib import Path

    import trainscale
    from trainscale.checkpoint import Checkpointer, RNGState

    out = {}
    with trainscale.init(seed=0) as rt:
        for strategy in STRATEGIES:
            model, optimizer, loader = _matrix_parts(rt, strategy)
            stop, seen, step = matrix_stop(rt.world_size, strategy), [], 0
            for x, _ids in loader:  # epoch 0
                model(x).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
            for x, ids in loader:  # epoch 1, up to the stop
                model(x).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
                seen += ids.tolist()
                step += 1
                if step == stop:
                    break
            saver = Checkpointer(Path(root) / strategy, rt, strategy=rt.strategy_of(model))
            saver.save(
                step, {"model": rt.checkpoint_state(model, optimizer), "rng": RNGState(rt.device), "loader": loader}
            )
            saver.close()
            out[strategy] = (seen, _digest(model))
    return out


def resume_on_r_ranks(copies: str) -> dict:
    """Every copy ``<S>-<saved strategy>-<strategy>``: restored under its last strategy; the weights' digest,
    the ids this rank is handed for the rest of epoch 1, and the loss of one more step (the optimizer state works)."""
    from pathlib import Path

    import trainscale
    from trainscale.checkpoint import Checkpointer, RNGState

    out = {}
    with trainscale.init(seed=0) as rt:
        for directory in sorted(Path(copies).iterdir()):
            strategy = directory.name.split("-")[2]
            model, optimizer, loader = _matrix_parts(rt, strategy)
            restorer = Checkpointer(directory, rt, strategy=rt.strategy_of(model))
            found = restorer.restore(
                {"model": rt.checkpoint_state(model, optimizer), "rng": RNGState(rt.device), "loader": loader}
            )
            assert found is not None, directory
            digest, ids, loss = _digest(model), [], None
            for x, batch_ids in loader:
                ids += batch_ids.tolist()
                if loss is None:
                    loss = model(x).pow(2).mean()
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()
                    loss = float(loss)
            restorer.close()
            out[directory.name] = (loader.state_dict()["epoch"], digest, ids, loss)
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_shape_and_strategy_pair_resumes_the_saved_weights_and_the_rest_of_the_epoch_once(tmp_path):
    """Done-when of issue 36 with real ranks: S, R in {1, 2, 3, 4} x {ddp, zero1, fsdp} saved and resumed under
    every strategy (144 resumes): 0 duplicated, 0 skipped samples in the interrupted epoch, the saved weights."""
    import shutil

    from helpers.multiproc import run_on_ranks

    saved = {}
    for s in range(1, 5):
        results = run_on_ranks(save_on_s_ranks, s, str(tmp_path / f"saved-{s}"), timeout=300)
        for strategy in STRATEGIES:
            seen = [i for rank in range(s) for i in results[rank][strategy][0]]
            assert len(seen) == len(set(seen)) == matrix_stop(s, strategy) * s * MATRIX_BATCH
            saved[s, strategy] = (seen, results[0][strategy][1])  # the whole weights, gathered on rank 0
    for r in range(1, 5):
        copies = tmp_path / f"copies-{r}"
        for s, strategy in saved:
            for then in STRATEGIES:  # a directory of its own each: one run per checkpoint directory
                shutil.copytree(tmp_path / f"saved-{s}" / strategy, copies / f"{s}-{strategy}-{then}")
        results = run_on_ranks(resume_on_r_ranks, r, str(copies), timeout=300)
        for name in results[0]:
            s, strategy, then = name.split("-")
            seen, digest = saved[int(s), strategy]
            epochs = {results[rank][name][0] for rank in range(r)}
            assert epochs == {2}, (name, r, epochs)  # the loader finished epoch 1
            assert results[0][name][1] == digest, (name, r)  # the saved weights, whole on rank 0
            rest = [i for rank in range(r) for i in results[rank][name][2]]
            assert len(rest) == len(set(rest)), (name, r, "a sample handed out twice")
            assert not set(rest) & set(seen), (name, r, "a sample trained before the stop handed out again")
            assert set(rest) | set(seen) == set(range(MATRIX_N)), (name, r, "samples skipped")
            losses = {results[rank][name][3] for rank in range(r)}
            assert len(losses) <= r and all(loss == loss for loss in losses)  # a finite step after the resume
        assert len(results[0]) == 36


# -- DeepSpeed's own files resume under ddp, zero1 and fsdp -------------------------------------------------------
DS_SCRIPT = """
import os
import torch
from torch import nn
import trainscale
from trainscale.data import DistributedLoader

class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 96
    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(4, generator=g), torch.randn(1, generator=g)

stop = int(os.environ["STOP_AT"])
with trainscale.init(seed=0) as rt:
    strategy = os.environ["STRATEGY"]
    net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))
    make = lambda p: torch.optim.Adam(p, lr=1e-2)
    if os.environ["OPTIM"] == "sgd-groups":  # a frozen layer, two groups with their own options, momentum
        net[0].weight.requires_grad_(False)
        trained = [(n, p) for n, p in net.named_parameters() if p.requires_grad]
        make = torch.optim.SGD([{"params": [p for n, p in trained if n.endswith("weight")], "weight_decay": 0.1},
                                {"params": [p for n, p in trained if n.endswith("bias")], "weight_decay": 0.0}],
                               lr=5e-2, momentum=0.9)
    model, optimizer = rt.setup(net, make, strategy=strategy, micro_batch_size=4)
    loader = DistributedLoader.for_runtime(Data(), rt, batch_size=4)
    step = rt.resume(model, optimizer, loader=loader)
    whole = lambda: {k: v.detach().float().cpu().clone() for k, v in rt._find(model)[1].full_model_state(model).items()}
    if step:
        resumed = whole()  # a collective under fsdp: every rank
        if rt.rank == 0:
            torch.save(resumed, "resumed.pt")
    for x, y in loader:
        rt.backward((model(x) - y).pow(2).mean(), model)
        optimizer.step()
        optimizer.zero_grad()
        step += 1
        if step == stop:
            rt.checkpoint(step, model, optimizer, every=stop, loader=loader)
            saved = whole()
            if rt.rank == 0:
                torch.save(saved, "saved.pt")
        if step == stop + 1:
            after = whole()
            if rt.rank == 0:
                torch.save(after, f"after-{os.environ['ATTEMPT']}.pt")
            break
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "stage, then, ranks, optim",
    [
        (1, "ddp", 2, "adam"),
        (2, "fsdp", 2, "adam"),
        (3, "zero1", 2, "adam"),
        (2, "fsdp", 3, "adam"),
        (3, "ddp", 1, "adam"),
        (2, "zero1", 2, "sgd-groups"),
        (3, "fsdp", 2, "sgd-groups"),
    ],
)
def test_deepspeeds_own_files_resume_under_another_strategy_with_their_optimizer_state(
    tmp_path, stage, then, ranks, optim
):
    """DeepSpeed ZeRO (stage 1, 2, 3) on 2 ranks checkpoints at step 3 and trains one more step; the same
    checkpoint resumed under ddp, fsdp or zero1 starts from the saved weights on any number of ranks, and on 2
    its next step (the same samples: the cursor) lands where DeepSpeed's did: the Adam moments and step count
    came along (and DeepSpeed no longer clips the gradients where the others do not); also with a frozen layer
    and two parameter groups of their own options under SGD with momentum."""
    import torch

    (tmp_path / "train.py").write_text(DS_SCRIPT)
    env = {"STRATEGY": f"deepspeed:stage={stage}", "STOP_AT": "3", "ATTEMPT": "0", "OPTIM": optim}
    first = trainscale("run", "--nproc-per-node", "2", "--log-dir", "logs", "train.py", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    second = trainscale(
        "run",
        "--nproc-per-node",
        str(ranks),
        "--log-dir",
        "logs",
        "train.py",
        cwd=tmp_path,
        env={**env, "STRATEGY": then, "ATTEMPT": "1"},
    )
    assert second.returncode == 0, second.stdout + second.stderr
    assert "resumed from checkpoints/ckpt-00000003 at step 3" in second.stdout, second.stdout
    saved, resumed = torch.load(tmp_path / "saved.pt"), torch.load(tmp_path / "resumed.pt")
    assert saved.keys() == resumed.keys() and all(torch.equal(saved[k], resumed[k]) for k in saved)
    if ranks != 2:
        return  # another global batch from here on: the next step is another step
    theirs, ours = torch.load(tmp_path / "after-0.pt"), torch.load(tmp_path / "after-1.pt")
    moved = max(float((theirs[k] - saved[k]).abs().max()) for k in saved)
    assert moved > 1e-4  # the step changed the weights: the comparison below means something
    for k in theirs:
        assert torch.allclose(ours[k], theirs[k], rtol=0, atol=1e-6), (k, float((ours[k] - theirs[k]).abs().max()))


# -- three interruptions per run, 20 seeds, real ranks ----------------------------------------------------------
# Each seed's run is 4 segments on random shapes (1-4 ranks) and strategies, stopped at 3 random points of its 2
# epochs (multiples of 24 samples: no drop_last tail on any shape). The segments of one round that share a shape
# run in one launch, each from its seed's own checkpoint directory: 4 rounds x at most 4 shapes = 16 launches.
def interrupted_chain(seed: int) -> tuple[list[int], list[str], list[int]]:
    rng = random.Random(f"chain{seed}")
    shapes = [rng.randint(1, 4) for _ in range(4)]
    strategies = [rng.choice(STRATEGIES) for _ in range(4)]
    stops = [24 * k for k in sorted(rng.sample(range(1, 2 * MATRIX_N // 24), 3))] + [2 * MATRIX_N]
    return shapes, strategies, stops


def run_segments(root: str, jobs: list[tuple[int, int]]) -> dict:
    """Each (seed, segment): restore the seed's newest checkpoint (segments after the first), train to the
    segment's stop, checkpoint (all but the last). The weights' digest after the restore and at the save, and
    the (epoch, ids) this rank trained."""
    from pathlib import Path

    import trainscale
    from trainscale.checkpoint import Checkpointer, RNGState

    out = {}
    with trainscale.init(seed=0) as rt:
        for seed, k in jobs:
            shapes, strategies, stops = interrupted_chain(seed)
            model, optimizer, loader = _matrix_parts(rt, strategies[k])
            keeper = Checkpointer(Path(root) / f"seed{seed}", rt, strategy=rt.strategy_of(model))
            entries = {"model": rt.checkpoint_state(model, optimizer), "rng": RNGState(rt.device), "loader": loader}
            resumed = None
            if k:
                assert keeper.restore(entries) is not None
                resumed = _digest(model)
            offset, end, seen = (stops[k - 1] if k else 0), stops[k], []
            while offset < end:
                epoch = loader.state_dict()["epoch"]
                for x, ids in loader:
                    model(x).pow(2).mean().backward()
                    optimizer.step()
                    optimizer.zero_grad()
                    seen.append((epoch, ids.tolist()))
                    offset += rt.world_size * MATRIX_BATCH
                    if offset == end:
                        break
            saved = None
            if k < 3:
                keeper.save(offset, entries)  # the step: the samples trained so far (it only grows)
                saved = _digest(model)
            keeper.close()
            out[seed, k] = (resumed, saved, seen)
    return out


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_three_random_interruptions_on_random_shapes_and_strategies_over_20_seeds(tmp_path):
    from helpers.multiproc import run_on_ranks

    seeds = range(20)
    results: dict = {}
    for k in range(4):
        for ranks in range(1, 5):
            jobs = [(seed, k) for seed in seeds if interrupted_chain(seed)[0][k] == ranks]
            if jobs:
                per_rank = run_on_ranks(run_segments, ranks, str(tmp_path), jobs, timeout=300)
                for job in jobs:
                    results[job] = [per_rank[r][job] for r in range(ranks)]
    for seed in seeds:
        shapes, strategies, stops = interrupted_chain(seed)
        for k in range(1, 4):  # every segment starts from the weights the previous one saved
            assert results[seed, k][0][0] == results[seed, k - 1][0][1], (seed, k, shapes, strategies)
        for epoch in (0, 1):
            ids = [
                i for k in range(4) for rank in results[seed, k] for e, batch in rank[2] if e == epoch for i in batch
            ]
            assert sorted(ids) == list(range(MATRIX_N)), (seed, epoch, shapes, strategies, stops)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_deepspeed_resuming_its_own_files_on_another_world_size_names_the_strategies_that_can(tmp_path):
    (tmp_path / "train.py").write_text(DS_SCRIPT)
    env = {"STRATEGY": "deepspeed:stage=2", "STOP_AT": "3", "ATTEMPT": "0", "OPTIM": "adam"}
    first = trainscale("run", "--nproc-per-node", "2", "--log-dir", "logs", "train.py", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    again = trainscale(
        "run", "--nproc-per-node", "3", "--log-dir", "logs", "train.py", cwd=tmp_path, env={**env, "ATTEMPT": "1"}
    )
    assert again.returncode == 1, again.stdout + again.stderr
    assert "holds DeepSpeed ZeRO shards for 2 rank(s); this run has 3" in again.stderr, again.stderr[-2000:]
    assert "or under --strategy fsdp, zero1 or ddp" in again.stderr and "Traceback" not in again.stderr


def convert_deepspeed_files(marks: str) -> dict:
    """One rank's resume from DeepSpeed's files (their merge faked: it leaves a file in ``marks`` per call)."""
    from pathlib import Path
    from types import SimpleNamespace

    import torch

    import trainscale as ts
    from trainscale.strategies import portable

    def merge(directory):
        (Path(marks) / f"merged-by-{os.environ['RANK']}").write_text(str(directory))
        return {
            "model": {"weight": torch.full((2, 3), 7.0), "bias": torch.zeros(2)},
            "optimizer": {
                "state": {"weight": {"step": torch.tensor(3.0), "exp_avg": torch.ones(2, 3)}},
                "param_groups": [{"lr": 0.5, "betas": (0.9, 0.99), "params": ["weight", "bias"]}],
            },
        }

    portable.from_deepspeed = merge
    with ts.init(device="cpu", timeout_s=60):
        model = torch.nn.Linear(3, 2)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
        got = portable.from_shards(model, optimizer, SimpleNamespace(format="deepspeed", path=Path(marks)))
    group, state = got["optimizer"]["param_groups"][0], got["optimizer"]["state"][0]
    return {
        "weight": got["model"]["weight"].tolist(),
        "lr": group["lr"],
        "params": group["params"],
        "step": float(state["step"]),
        "exp_avg": state["exp_avg"].tolist(),
    }


def test_deepspeeds_files_are_merged_once_per_node_and_read_by_its_other_ranks(tmp_path):
    """issue 47 N6: every rank merged the whole model and its Adam state (~84 GB a rank for 7B); now local rank 0
    of each node merges, its node's ranks read the result. Three ranks as two nodes (2 + 1): two merges."""
    from helpers.multiproc import run_on_ranks

    two_nodes = {
        r: {"LOCAL_RANK": str(local), "LOCAL_WORLD_SIZE": str(size), "GROUP_RANK": str(node)}
        for r, (local, size, node) in enumerate([(0, 2, 0), (1, 2, 0), (0, 1, 1)])
    }
    results = run_on_ranks(
        convert_deepspeed_files, 3, str(tmp_path), rank_env=two_nodes, env={"TMPDIR": str(tmp_path)}, timeout=120
    )
    assert sorted(p.name for p in tmp_path.glob("merged-by-*")) == ["merged-by-0", "merged-by-2"]
    assert all(results[r] == results[0] for r in range(3)) and results[0]["weight"] == [[7.0] * 3] * 2
    assert results[0]["lr"] == 0.5 and results[0]["params"] == [0, 1] and results[0]["step"] == 3.0
    assert not list(tmp_path.glob("trainscale-deepspeed-*"))  # the node-local files are gone
