"""Hangs in scripts that never import trainscale: is each one noticed, how fast, with the right rank, host and
place — and does a clean run under load ever get a notice or get stopped?

    .venv/bin/python benchmarks/hangs.py [--modes local,torchrun,srun] [--scripts plain,hf,deepspeed]
                                         [--kinds all] [--clean 20] [--seed 0] [--out hangs.json]

Kinds (rank 1 of 2, at a random step of 3-12): ``data-sleep`` (its Dataset sleeps: a stuck reader);
``worker-stuck`` (one of its DataLoader worker processes stops); ``skip`` (it skips the metric all-reduce
every rank makes per step); ``extra`` (it makes one more); ``shape`` (every rank all-reduces a tensor whose
length depends on its rank: a shape mismatch); ``gil`` (a regular expression that backtracks for hours, holding
the GIL); ``sigstop`` (its process is stopped). Scripts: a plain DDP loop (seed 004's kind), an HF ``Trainer``
and a DeepSpeed engine, each written as courses write them; the data-side kinds apply to all three, the
collective ones to the plain loop. Modes: ``trainscale run --nproc-per-node 2`` here, and ``trainscale slurm``
jobs of 2 nodes x 1 rank in torchrun and srun mode on the local test cluster (tests/slurm/cluster.sh up).

A trial ends when the hang watch's notice lands in the run's ``metrics/events.jsonl`` (default notice interval:
20 s) or after ``--give-up`` seconds; time to notice = the notice's time - the moment the culprit hung (it
writes the time first). Right culprit: the notice names rank 1 (a desync: rank 1 among the ranks named), its
host (n2 on the cluster), and its place (the kind's own frame, or the stopped/held state). gloo detects some
mismatches itself and aborts a rank at once (no hang): such trials are listed as "crashed", with whether the
launcher's summary named rank 1 first. Clean runs: the plain loop, 40 steps, with a busy loop on one core beside
it; a notice or a failure there is a false alarm.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from _common import PYTHON, ROOT, clean_env, load

CLUSTER_ENV: dict[str, str] = {}
KINDS = ("data-sleep", "worker-stuck", "skip", "extra", "shape", "gil", "sigstop")
DATA_KINDS = ("data-sleep", "worker-stuck", "gil", "sigstop")

HANG_DATA = textwrap.dedent('''
    """The hang, injected where a course script would meet it (imported by the three scripts)."""
    import os, re, signal, time
    import torch
    import torch.distributed as dist

    KIND, RANK, STEP = os.environ["HANG_KIND"], int(os.environ["HANG_RANK"]), int(os.environ["HANG_STEP"])
    OUT = os.environ["OUT"]
    ARMED = os.path.join(OUT, f"hang-armed-rank{os.environ.get('RANK', '0')}")  # this rank's (a worker's too)
    state = {"step": 0}

    def started():
        import json, socket
        where = {"t": time.time(), "host": os.environ.get("SLURMD_NODENAME") or socket.gethostname(),
                 "pid": os.getpid()}
        with open(os.path.join(OUT, "hang-started"), "w") as fh:
            json.dump(where, fh)

    def here():
        return dist.is_initialized() and dist.get_rank() == RANK and state["step"] == STEP

    class Samples(torch.utils.data.Dataset):
        """Samples whose loading hangs for the data-side kinds (in a worker process for worker-stuck)."""
        def __init__(self, n=4096, dim=32, tokens=False):
            self.n, self.dim, self.tokens = n, dim, tokens
        def __len__(self):
            return self.n
        def __getitem__(self, i):
            if KIND == "worker-stuck" and os.path.exists(ARMED):  # a file: the DataLoader worker sees it too
                if torch.utils.data.get_worker_info() is not None:
                    started(); time.sleep(3600)
            g = torch.Generator().manual_seed(i)
            if self.tokens:
                ids = torch.randint(0, 128, (32,), generator=g)
                return {"input_ids": ids, "labels": ids}
            x = torch.randn(self.dim, generator=g)
            return x, int(x.sum() > 0)

    def next_step():
        """Called once per step, where the next batch's loading starts: the culprit's data-side hang."""
        state["step"] += 1
        if not here():
            return
        if KIND == "worker-stuck":  # its DataLoader worker stops at its next sample
            open(ARMED, "w").close()
        if KIND == "data-sleep":  # a stuck reader (NFS, a lock)
            started(); time.sleep(3600)
        if KIND == "gil":  # a regular expression that backtracks for hours, the GIL held throughout
            started(); re.match(r"(a+)+$", "a" * 64 + "b")
        if KIND == "sigstop":
            started(); os.kill(os.getpid(), signal.SIGSTOP)

    def metric(value):
        """The per-step metric all-reduce the plain loop makes; the collective kinds bend it on the culprit."""
        t = torch.tensor([float(value)])
        if KIND == "shape" and state["step"] == STEP:
            if dist.get_rank() == RANK:
                started()
            t = torch.ones(3 + dist.get_rank())
        if here() and KIND == "skip":
            started(); return
        dist.all_reduce(t)
        if here() and KIND == "extra":
            started(); dist.all_reduce(t)
''')

PLAIN = textwrap.dedent("""
    import os, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler
    from hang_data import Samples, metric, next_step

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    data = Samples()
    workers = 1 if os.environ["HANG_KIND"] == "worker-stuck" else 0
    loader = DataLoader(data, batch_size=8, sampler=DistributedSampler(data, seed=0), num_workers=workers)
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        metric(loss.item())
        time.sleep(0.05)  # a step of a real model takes longer than this toy's
        next_step()
        if step + 1 == int(os.environ.get("STEPS", "1000")):
            break
    dist.destroy_process_group()
""")

HF = textwrap.dedent("""
    import os
    import torch
    from transformers import GPTNeoConfig, GPTNeoForCausalLM, Trainer, TrainerCallback, TrainingArguments
    from hang_data import Samples, next_step

    class Steps(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            next_step()

    torch.manual_seed(0)
    config = GPTNeoConfig(vocab_size=128, hidden_size=32, num_layers=2, num_heads=2, max_position_embeddings=64,
                          attention_types=[[["global", "local"], 1]], window_size=16)
    args = TrainingArguments(output_dir=os.path.join(os.environ["OUT"], "hf"), per_device_train_batch_size=4,
                             max_steps=1000, learning_rate=1e-3, save_strategy="no", report_to=[], disable_tqdm=True,
                             dataloader_num_workers=1 if os.environ["HANG_KIND"] == "worker-stuck" else 0,
                             use_cpu=True, seed=0, logging_steps=1000)
    Trainer(model=GPTNeoForCausalLM(config), args=args, train_dataset=Samples(tokens=True),
            callbacks=[Steps()]).train()
""")

DS = textwrap.dedent("""
    import argparse, os, time
    import deepspeed, torch
    from hang_data import Samples, next_step

    parser = argparse.ArgumentParser()
    parser.add_argument("--local-rank", type=int, default=-1)
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    deepspeed.init_distributed()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    engine, _, loader, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(),
                                                training_data=Samples())
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(engine(x), y)
        engine.backward(loss); engine.step()
        time.sleep(0.05)
        next_step()
""")

DS_CONFIG = {
    "train_micro_batch_size_per_gpu": 8,
    "gradient_accumulation_steps": 1,
    "optimizer": {"type": "SGD", "params": {"lr": 0.05}},
    "zero_optimization": {"stage": 1},
    "zero_allow_untested_optimizer": True,
}
SCRIPTS = {
    "plain": ("plain.py", PLAIN, []),
    "hf": ("hf_train.py", HF, []),
    "deepspeed": ("ds_train.py", DS, ["--deepspeed", "--deepspeed_config", "ds_config.json"]),
}
EXPECTED_PLACE = {
    "data-sleep": "in next_step",
    "worker-stuck": "dataloader.py",
    "gil": "not responding",
    "sigstop": "stopped",
    "skip": "desync",
    "extra": "desync",
    "shape": "desync",
}


def workdir(root: Path) -> Path:
    """The scripts, in a directory of their own: a SLURM job snapshots the directory it is submitted from."""
    scripts = root / "scripts"
    scripts.mkdir(parents=True, exist_ok=True)
    (scripts / "hang_data.py").write_text(HANG_DATA)
    for name, text, _ in SCRIPTS.values():
        (scripts / name).write_text(text)
    (scripts / "ds_config.json").write_text(json.dumps(DS_CONFIG))
    return scripts


def events(out: Path) -> list[dict]:
    """The notices in a trial's own run (trainscale run's run directory, or the job's)."""
    found = []
    for path in [*out.glob("runs/*-*/metrics/events.jsonl"), *out.glob("jobs/trainscale-*/metrics/events.jsonl")]:
        for line in path.read_text().splitlines():
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return found


def cluster_env() -> dict[str, str]:
    """What a SLURM client needs to reach the local test cluster (tests/slurm/cluster.sh env)."""
    done = subprocess.run(["bash", str(ROOT / "tests" / "slurm" / "cluster.sh"), "env"], capture_output=True, text=True)
    return dict(line.split("=", 1) for line in done.stdout.splitlines() if "=" in line and not line.startswith("logs"))


def env_for(out: Path, kind: str, step: int) -> dict[str, str]:
    from trainscale.strategies.deepspeed import extensions_dir

    return clean_env(
        **CLUSTER_ENV,
        OUT=str(out),
        HANG_KIND=kind,
        HANG_RANK="1",
        HANG_STEP=str(step),
        TORCH_EXTENSIONS_DIR=extensions_dir(),
        OMP_NUM_THREADS="1",
        PATH=f"{Path(PYTHON).parent}{os.pathsep}{os.environ['PATH']}",
        TRAINSCALE_STATE_DIR=str(out / "state"),
    )


def start(mode: str, script: str, root: Path, out: Path, env: dict[str, str]) -> tuple[subprocess.Popen, str | None]:
    name, _, extra = SCRIPTS[script]
    if mode == "local":
        cmd = [
            PYTHON,
            "-m",
            "trainscale",
            "run",
            "--nproc-per-node",
            "2",
            "--log-dir",
            str(out / "runs"),
            str(root / name),
            *extra,
        ]
        return subprocess.Popen(
            cmd, cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
        ), None
    cmd = [
        PYTHON,
        "-m",
        "trainscale",
        "slurm",
        "--profile",
        "local-test",
        "-N",
        "2",
        "--gpus-per-node",
        "1",
        "-c",
        "2",
        "-t",
        "00:10:00",
        "--launcher",
        mode,
        "--output-dir",
        str(out / "jobs"),
        "--python",
        PYTHON,
        "--submit",
        str(root / name),
        *extra,
    ]
    done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    m = re.search(r"submitted job (\d+)", done.stderr)
    if not m:
        raise RuntimeError(f"not submitted: {done.stderr[-2000:]}")
    return None, m.group(1)


def stop(proc: subprocess.Popen | None, job: str | None) -> str:
    if proc is not None:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        return proc.stdout.read() if proc.stdout else ""
    subprocess.run(["scancel", job], capture_output=True, env={**os.environ, **CLUSTER_ENV})
    return ""


def trial(mode: str, script: str, kind: str, step: int, root: Path, give_up: float) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"{mode}-{script}-{kind}-", dir=root.parent))
    env = env_for(out, kind, step)
    began = time.time()
    proc, job = start(mode, script, root, out, env)
    notice, crashed = None, False
    while time.time() - began < give_up:
        found = [e for e in events(out) if e.get("kind") == "hang"]
        if found:
            notice = found[0]
            break
        if proc is not None and proc.poll() is not None:
            crashed = True
            break
        if job is not None:
            state = subprocess.run(
                ["squeue", "-h", "-j", job, "-o", "%T"],
                capture_output=True,
                text=True,
                env={**os.environ, **CLUSTER_ENV},
            ).stdout
            if not state.strip():
                crashed = True
                break
        time.sleep(0.5)
    said = stop(proc, job)
    if job is not None:
        said = "\n".join(p.read_text(errors="replace") for p in (out / "jobs").glob("**/*.out"))
    culprit = json.loads((out / "hang-started").read_text()) if (out / "hang-started").exists() else None
    hung_at = culprit["t"] if culprit else None
    row = {"mode": mode, "script": script, "kind": kind, "step": step, "hung": hung_at is not None}
    if notice is None:
        row.update(
            detected=False,
            crashed=crashed,
            crash_named=bool(re.search(r"first failing rank: 1 ", said)) if crashed else None,
            said=said[-1500:],
        )
        return row
    text = notice.get("text") or notice.get("message", "")
    place = EXPECTED_PLACE[kind]
    # its host (and pid) as the culprit itself wrote them: in torchrun mode the rendezvous numbers the nodes
    where = (
        f"rank 1 on {culprit['host']} (pid {culprit['pid']})"
        if culprit and kind != "worker-stuck"
        else f"rank 1 on {culprit['host']}"
        if culprit
        else "?"
    )
    row.update(
        detected=True,
        seconds=notice["t"] - hung_at if hung_at else None,
        verdict=notice.get("verdict"),
        culprit=1 in (notice.get("culprits") or []),
        host=where in text or kind in ("skip", "extra", "shape"),
        place=(notice.get("verdict") == "desync") if place == "desync" else place in text,
        text=text[:1500],
    )
    return row


def clean(mode: str, root: Path, k: int) -> dict:
    out = Path(tempfile.mkdtemp(prefix=f"clean-{mode}-", dir=root.parent))
    env = {**env_for(out, "none", -1), "STEPS": "40"}
    busy = subprocess.Popen([PYTHON, "-c", "while True: pass"])
    try:
        if mode == "local":
            done = subprocess.run(
                [
                    PYTHON,
                    "-m",
                    "trainscale",
                    "run",
                    "--nproc-per-node",
                    "2",
                    "--log-dir",
                    str(out / "runs"),
                    str(root / "plain.py"),
                ],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            ok = done.returncode == 0
        else:
            done = subprocess.run(
                [
                    PYTHON,
                    "-m",
                    "trainscale",
                    "slurm",
                    "--profile",
                    "local-test",
                    "-N",
                    "2",
                    "--gpus-per-node",
                    "1",
                    "-c",
                    "2",
                    "-t",
                    "00:10:00",
                    "--launcher",
                    mode,
                    "--output-dir",
                    str(out / "jobs"),
                    "--python",
                    PYTHON,
                    "--submit",
                    "--watch",
                    "--poll",
                    "1",
                    str(root / "plain.py"),
                ],
                cwd=root,
                env=env,
                capture_output=True,
                text=True,
                timeout=600,
            )
            ok = done.returncode == 0 and "COMPLETED" in done.stdout
    finally:
        busy.kill()
    notices = [e for e in events(out) if e.get("kind") == "hang"]
    return {"mode": mode, "clean": k, "ok": ok, "notices": len(notices)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--modes", default="local,torchrun,srun")
    p.add_argument("--scripts", default="plain,hf,deepspeed")
    p.add_argument("--kinds", default="all")
    p.add_argument("--clean", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--give-up", type=float, default=150.0)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    rng = random.Random(a.seed)
    if set(a.modes.split(",")) - {"local"}:
        CLUSTER_ENV.update(cluster_env())
    root = workdir(Path(tempfile.mkdtemp(prefix="ts-hangs-")))
    kinds = KINDS if a.kinds == "all" else tuple(a.kinds.split(","))
    rows = []
    for mode in a.modes.split(","):
        for script in a.scripts.split(","):
            for kind in kinds:
                if script != "plain" and kind not in DATA_KINDS:
                    continue
                row = trial(mode, script, kind, rng.randint(3, 12), root, a.give_up)
                rows.append(row)
                print(json.dumps({k: v for k, v in row.items() if k not in ("text", "said")}), flush=True)
    cleans = [clean(a.modes.split(",")[k % len(a.modes.split(","))], root, k) for k in range(a.clean)]
    for c in cleans:
        print(json.dumps(c), flush=True)
    hung = [r for r in rows if r["hung"] and not r.get("crashed")]
    detected = [r for r in hung if r["detected"]]
    right = [r for r in detected if r["culprit"] and r["host"] and r["place"]]
    times = [r["seconds"] for r in detected if r["seconds"] is not None]
    crashed = [r for r in rows if r.get("crashed")]
    named = sum(bool(r["crash_named"]) for r in crashed)
    print(
        f"\ntrials {len(rows)}: {len(hung)} hung, {len(detected)} noticed; {len(crashed)} crashed instead "
        f"(gloo's own mismatch check), the summary naming rank 1 first in {named}"
    )
    if times:
        print(f"time to notice: median {statistics.median(times):.1f}s, worst {max(times):.1f}s")
    print(f"right culprit, host and place: {len(right)} of {len(detected)}")
    print(
        f"clean runs under a busy loop: {sum(c['ok'] for c in cleans)} of {len(cleans)} finished, "
        f"{sum(c['notices'] for c in cleans)} notice(s); {load()}"
    )
    if a.out:
        Path(a.out).write_text(json.dumps({"trials": rows, "clean": cleans}, indent=1))


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT / "src"))
    main()
