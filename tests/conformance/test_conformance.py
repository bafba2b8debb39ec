"""Course-style scripts run unchanged under trainscale (scripts/: one per style the seeds teach).

Each script picks its backend as a course script does (nccl with CUDA, else gloo) and writes one JSON
file per rank. Every run checks: each rank got a distinct rank (and SLURM-style ranks agree with
torchrun-style ones), the model ended the same on every rank, and the run's exit code.

- under `trainscale run` with torchrun's exact options from the seeds (seed 003's --standalone
  --redirects 3 --log-dir, seed 002's --nproc_per_node/--master_addr/--master_port/--node_rank, ...);
- under `trainscale slurm --launcher torchrun` and `--launcher srun` on the local 2-node cluster.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent / "scripts"
DS_CONFIG = SCRIPTS / "ds_config.json"
HAVE_HF = importlib.util.find_spec("transformers") is not None
HAVE_DS = importlib.util.find_spec("deepspeed") is not None
pytestmark = pytest.mark.slow


def env_for(tmp_path: Path) -> dict[str, str]:
    # DeepSpeed builds a communication op on its first start: share trainscale's cache of it, built by the
    # venv's ninja as in README's activated venv (the system's ninja keeps another build log and rebuilds it)
    from trainscale.strategies.deepspeed import extensions_dir

    return {
        **os.environ,
        "TRAINSCALE_STATE_DIR": str(tmp_path / "state"),
        "TORCH_EXTENSIONS_DIR": extensions_dir(),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
    }


def trainscale(
    tmp_path: Path, *argv: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainscale", *argv],
        env=env or env_for(tmp_path),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def results(out: Path, world: int) -> list[dict]:
    files = sorted(out.glob("rank-*.json"))
    found = [json.loads(p.read_text()) for p in files]
    assert sorted(r["rank"] for r in found) == list(range(world)), [p.name for p in files]
    return found


def check_world(found: list[dict], world: int, local_world: int) -> None:
    """Distinct ranks, SLURM's and torchrun's variables agreeing, the same model on every rank."""
    for r in found:
        env = r["env"]
        assert r["world_size"] == world and int(env["WORLD_SIZE"]) == world, r
        assert int(env["RANK"]) == r["rank"] == int(env["SLURM_PROCID"]), env
        assert int(env["LOCAL_RANK"]) == int(env["SLURM_LOCALID"]) == r["rank"] % local_world, env
        assert int(env["NODE_RANK"]) == int(env["SLURM_NODEID"]) == r["rank"] // local_world, env
        assert int(env["SLURM_NTASKS"]) == world and int(env["LOCAL_WORLD_SIZE"]) == local_world, env
    sums = {r["checksum"] for r in found if "checksum" in r}
    assert len(sums) <= 1, f"ranks ended with different weights: {sums}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ------------------------------------------------------------------------ one style = one script + its arguments
def style_args(style: str, tmp_path: Path, out: Path) -> list[str]:
    if style == "torchrun-env DDP":
        return [str(SCRIPTS / "ddp_torchrun.py"), "--experiment-dir", str(tmp_path / "exp"), "--out", str(out)]
    if style == "srun-env DDP":
        return [str(SCRIPTS / "ddp_srun_env.py"), "--data", str(tmp_path / "data"), "--out", str(out)]
    if style == "HF Trainer":
        return [str(SCRIPTS / "hf_trainer.py"), "--output-path", str(tmp_path / "hf"), "--out", str(out)]
    if style == "DeepSpeed":
        return [
            str(SCRIPTS / "deepspeed_train.py"),
            "--data",
            str(tmp_path / "data"),
            "--out",
            str(out),
            "--deepspeed",
            "--deepspeed_config",
            str(DS_CONFIG),
        ]
    if style == "elastic @record":
        return [str(SCRIPTS / "elastic_record.py"), "--out", str(out)]
    raise AssertionError(style)


STYLES = [
    pytest.param("torchrun-env DDP", id="torchrun-env"),
    pytest.param("srun-env DDP", id="srun-env"),
    pytest.param("HF Trainer", id="hf-trainer", marks=pytest.mark.skipif(not HAVE_HF, reason="transformers missing")),
    pytest.param("DeepSpeed", id="deepspeed", marks=pytest.mark.skipif(not HAVE_DS, reason="deepspeed missing")),
    pytest.param("elastic @record", id="elastic-record"),
]


# ---------------------------------------------------------------------------------------- trainscale run, locally
def test_seed_003_line_torchrun_env_ddp(tmp_path):
    # TORCHELASTIC_ERROR_FILE=../error.json OMP_NUM_THREADS=1 torchrun --standalone --nnodes 1 --nproc-per-node gpu
    #     --redirects 3 --log-dir ../logs train_llm.py ...      (2 CPU ranks here for `gpu`)
    out = tmp_path / "out"
    env = {**env_for(tmp_path), "TORCHELASTIC_ERROR_FILE": str(tmp_path / "error.json"), "OMP_NUM_THREADS": "1"}
    done = trainscale(
        tmp_path,
        "run",
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "2",
        "--redirects",
        "3",
        "--log-dir",
        str(tmp_path / "logs"),
        *style_args("torchrun-env DDP", tmp_path, out),
        env=env,
    )
    assert done.returncode == 0, done.stderr
    check_world(results(out, 2), 2, 2)
    assert "rank=0 world size=2" not in done.stdout  # --redirects 3: the ranks' output goes to files only
    logs = list((tmp_path / "logs").glob("*/attempt_0/0/stdout.log"))
    assert logs and "rank=0 world size=2" in logs[0].read_text()
    assert (tmp_path / "exp" / "model.pt").exists() and not (tmp_path / "error.json").exists()


def test_seed_002_line_srun_env_ddp_with_static_rendezvous(tmp_path):
    # torchrun --nproc_per_node 8 --nnodes $SLURM_NNODES --node_rank $SLURM_PROCID --master_addr $MASTER_ADDR
    #          --master_port $MASTER_PORT ...   : with a SLURM-style script that reads SLURM_PROCID/NODE_RANK itself
    out = tmp_path / "out"
    done = trainscale(
        tmp_path,
        "run",
        "--nproc_per_node",
        "2",
        "--nnodes",
        "1",
        "--node_rank",
        "0",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        *style_args("srun-env DDP", tmp_path, out),
    )
    assert done.returncode == 0, done.stderr
    check_world(results(out, 2), 2, 2)
    assert "Rank 0 on Node 0: Initializing process group." in done.stdout


@pytest.mark.skipif(not HAVE_HF, reason="transformers missing")
def test_seed_000_hf_trainer(tmp_path):
    out = tmp_path / "out"
    done = trainscale(
        tmp_path, "run", "--standalone", "--nnodes=1", "--nproc_per_node=2", *style_args("HF Trainer", tmp_path, out)
    )
    assert done.returncode == 0, done.stderr
    found = results(out, 2)
    check_world(found, 2, 2)
    assert all(r["per_device"] == 4 and r["steps"] == 4 for r in found)  # the global batch 8 split over 2 ranks
    assert done.stdout.count("train_loss=") == 1  # printed by one process


@pytest.mark.skipif(not HAVE_DS, reason="deepspeed missing")
@pytest.mark.timeout(600)  # two ranks importing DeepSpeed (~10 CPU-s each): 300 s was short beside busy processes
def test_seed_002_deepspeed_with_its_own_config(tmp_path):
    out = tmp_path / "out"
    done = trainscale(
        tmp_path,
        "run",
        "--nproc_per_node",
        "2",
        "--nnodes",
        "1",
        "--node_rank",
        "0",
        "--master_addr",
        "127.0.0.1",
        "--master_port",
        str(free_port()),
        *style_args("DeepSpeed", tmp_path, out),
        timeout=540,
    )
    assert done.returncode == 0, done.stderr
    found = results(out, 2)
    check_world(found, 2, 2)
    assert all(r["micro_batch"] == 8 and r["steps"] == 4 for r in found)
    # The same config with a batch size the world cannot hold is refused before any process starts.
    bad = tmp_path / "ds_bad.json"
    bad.write_text(
        DS_CONFIG.read_text().replace(
            '"gradient_accumulation_steps": 1,', '"gradient_accumulation_steps": 1, "train_batch_size": 24,'
        )
    )
    refused = trainscale(
        tmp_path,
        "run",
        "--nproc-per-node",
        "2",
        str(SCRIPTS / "deepspeed_train.py"),
        "--data",
        "d",
        "--out",
        "o",
        "--deepspeed",
        "--deepspeed_config",
        str(bad),
        timeout=60,
    )
    assert refused.returncode == 2 and "train_batch_size=24" in refused.stderr and "world size 2 = 16" in refused.stderr
    assert not (tmp_path / "o").exists()


def test_scripts_that_meet_at_a_port_of_their_own_run_as_under_python(tmp_path):
    """PyTorch's DDP tutorial starts its ranks itself (``mp.spawn``, its own MASTER_PORT), an older course's script
    meets at ``init_method="tcp://host:port"``: under `trainscale run` their rank 0 hosts the store there, as under
    ``python script.py`` (torchrun's agent store, inherited, left them waiting for a store no one hosts, silent,
    for the group's timeout). The ranks the tutorial spawns are observed as its process group's: each rank's
    steps recorded, and `trainscale report` reads them."""
    from trainscale.observe.records import read_run

    out = tmp_path / "out"
    env = {**env_for(tmp_path), "OUT": str(out), "PORT": str(free_port())}
    done = trainscale(tmp_path, "run", "--log-dir", "runs", str(SCRIPTS / "ddp_spawn.py"), env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    found = results(out, 2)
    assert {r["world_size"] for r in found} == {2} and len({r["checksum"] for r in found}) == 1, found
    assert "starts 2 process(es) of its own (torch.multiprocessing), observed as the ranks" in done.stderr
    run = next((tmp_path / "runs").glob("ddp_spawn-*"))
    ranks = read_run(run)["ranks"]
    assert sorted(ranks) == [0, 1] and all(sum(r["kind"] == "step" for r in ranks[k]) >= 3 for k in ranks), ranks
    report = trainscale(tmp_path, "report", str(run), "--text", env=env, timeout=120)
    assert report.returncode == 0 and "2 rank(s)" in report.stdout, report.stdout + report.stderr

    out = tmp_path / "tcp"
    env |= {"OUT": str(out), "INIT_METHOD": f"tcp://127.0.0.1:{free_port()}", "STEPS": "10"}
    done = trainscale(tmp_path, "run", "--nproc-per-node", "2", str(SCRIPTS / "ddp_plain.py"), env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    check_world(results(out, 2), 2, 2)
    assert "step records" in done.stderr, done.stderr


def test_elastic_record_restarts_and_error_file(tmp_path):
    # TORCHELASTIC_ERROR_FILE=error.json torchrun --standalone --nproc-per-node 2 --max-restarts 1 ...: rank 1 fails in
    # the first attempt, the group restarts and finishes; without restarts the error file holds rank 1's traceback.
    env = {**env_for(tmp_path), "TORCHELASTIC_ERROR_FILE": str(tmp_path / "error.json")}
    out = tmp_path / "out"
    done = trainscale(
        tmp_path,
        "run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        *style_args("elastic @record", tmp_path, out),
        "--fail-rank",
        "1",
        "--fail-attempts",
        "1",
        env=env,
    )
    assert done.returncode == 0, done.stderr
    found = results(out, 2)
    check_world(found, 2, 2)
    assert all(r["attempt"] == 1 and r["total"] == 3.0 for r in found)
    failed = trainscale(
        tmp_path,
        "run",
        "--standalone",
        "--nproc-per-node",
        "2",
        *style_args("elastic @record", tmp_path, tmp_path / "out2"),
        "--fail-rank",
        "1",
        "--fail-attempts",
        "1",
        env=env,
    )
    assert failed.returncode == 1 and "first failing rank: 1" in failed.stderr
    error = json.loads((tmp_path / "error.json").read_text())["message"]
    assert error["message"] == "RuntimeError: deliberate failure on rank 1 in attempt 0"
    assert "elastic_record.py" in error["extraInfo"]["py_callstack"]


# ------------------------------------------------------- what trainscale learns about a script that never imports it
PLAIN = SCRIPTS / "ddp_plain.py"


def plain_env(tmp_path: Path, out: Path, **knobs: str) -> dict[str, str]:
    return {**env_for(tmp_path), "OUT": str(out), **knobs}


def report_text(tmp_path: Path, target: str) -> str:
    done = trainscale(tmp_path, "report", target, "--text", timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def rank_rows(text: str) -> dict[int, list[str]]:
    """The report's per-rank table: rank -> its cells."""
    block = text.split("== Ranks ==", 1)[1].split("\n\n", 1)[0].splitlines()[2:]
    return {int(line.split()[0]): line.split() for line in block if line.split() and line.split()[0].isdigit()}


def test_recording_and_the_hang_watch_leave_training_bitwise_the_same(tmp_path):
    """The hooks only read: the same weights on every rank with and without them."""
    sums = {}
    for label, knobs in (("observed", {}), ("off", {"TRAINSCALE_RECORD": "0", "TRAINSCALE_HANG_NOTICE": "0"})):
        out = tmp_path / label
        done = trainscale(
            tmp_path,
            "run",
            "--nproc-per-node",
            "2",
            "--log-dir",
            str(tmp_path / label / "runs"),
            str(PLAIN),
            env=plain_env(tmp_path, out, STEPS="30", **knobs),
        )
        assert done.returncode == 0, done.stderr
        sums[label] = {r["checksum"] for r in results(out, 2)}
        metrics = list((tmp_path / label / "runs").glob("ddp_plain-*/metrics/rank-*.jsonl"))
        assert len(metrics) == (2 if label == "observed" else 0), metrics
    assert sums["observed"] == sums["off"] and len(sums["off"]) == 1, sums


def test_a_plain_script_gets_step_records_a_full_report_and_its_straggler_named_while_training(tmp_path):
    """Seed 004's kind of script, rank 1's data loading 15 ms slower per batch: the live watch names it with its
    cause, and `trainscale report` gives every rank's steps, phases and the straggler."""
    out = tmp_path / "out"
    done = trainscale(
        tmp_path,
        "run",
        "--nproc-per-node",
        "2",
        "--log-dir",
        str(tmp_path / "runs"),
        str(PLAIN),
        env=plain_env(tmp_path, out, STEPS="240", SLOW_RANK="1", SLOW_MS="15", TRAINSCALE_STRAGGLER_EVERY="1"),
    )
    assert done.returncode == 0, done.stderr
    said = done.stdout + done.stderr
    loader = "fetching its batches from the DataLoader"
    assert "trainscale: straggler: rank 1 on " in said and loader in said, said[-3000:]
    assert "(step records, every rank's logs, run.json)" in done.stderr
    text = report_text(tmp_path, str(next((tmp_path / "runs").glob("ddp_plain-*"))))
    rows = rank_rows(text)
    assert sorted(rows) == [0, 1] and all(row[2] == "240" for row in rows.values()), text
    assert "[problem] straggler: rank 1 on " in text and loader in text and "would take ~" in text, text
    assert "strategy   ddp" in text and "ddp_plain.py" in text.split("== Ranks ==")[0]


def test_a_plain_script_hang_is_named_within_the_notice_and_is_the_root_cause_at_the_timeout(tmp_path):
    """Rank 1's reader stops at step 5: one notice naming rank 1 and where it is (its Python stack), then, at the
    script's own collective timeout, the verdict as the root cause: in the summary, the launcher's error file
    (seed 003's TORCHELASTIC_ERROR_FILE) and the report."""
    out = tmp_path / "out"
    env = plain_env(
        tmp_path,
        out,
        HANG_RANK="1",
        HANG_STEP="5",
        PG_TIMEOUT="12",
        TRAINSCALE_HANG_NOTICE="3",
        TORCHELASTIC_ERROR_FILE=str(tmp_path / "error.json"),
    )
    t0 = time.monotonic()
    done = trainscale(
        tmp_path, "run", "--nproc-per-node", "2", "--log-dir", str(tmp_path / "runs"), str(PLAIN), env=env
    )
    print(f"\n[hang] ended in {time.monotonic() - t0:.1f}s")
    said = done.stdout + done.stderr
    assert done.returncode == 1, said[-3000:]
    notices = [line for line in said.splitlines() if "trainscale: hang: " in line]
    ours = "\n".join(line for line in said.splitlines() if "trainscale" in line)  # a heartbeat that stopped says so
    assert len(notices) == 1 and "rank(s) 1 did not arrive" in notices[0], ours[-6000:]
    assert "waited 3s in all_reduce" in notices[0] or "waited 4s in all_reduce" in notices[0], notices
    assert "in __getitem__" in said and "time.sleep(3600)" in said, said[-6000:]  # rank 1's own place and stack
    assert "Root cause: rank(s) 1 hung (stopped participating)" in done.stderr
    recorded = json.loads((tmp_path / "error.json").read_text())["message"]["message"]
    assert "CollectiveTimeout" in recorded and "rank(s) 1 did not arrive" in recorded, recorded
    text = report_text(tmp_path, str(next((tmp_path / "runs").glob("ddp_plain-*"))))
    assert "[problem] the run failed: first failing rank: 0" in text and "Root cause: rank(s) 1 hung" in text
    assert "[problem] hang: rank(s) 0 waited" in text and sorted(rank_rows(text)) == [0, 1], text


# ----------------------------------------------------------------------------- trainscale slurm, both launch modes
def submit_watch(
    tmp_path: Path, launcher: str, ranks_per_node: int, args: list[str], env: dict[str, str] | None = None
) -> tuple[str, str, float]:
    # The test nodes declare 4 CPUs on a 2-core machine and srun cannot lay out one task wider than
    # the real cores: 2 CPUs per task whatever the ranks per node.
    t0 = time.monotonic()
    done = trainscale(
        tmp_path,
        "slurm",
        "--profile",
        "local-test",
        "-N",
        "2",
        "--gpus-per-node",
        str(ranks_per_node),
        "-c",
        str(2 // ranks_per_node if launcher == "srun" else 2),
        "-t",
        "00:05:00",
        "--launcher",
        launcher,
        "--output-dir",
        str(tmp_path / "jobs"),
        "--python",
        sys.executable,
        "--submit",
        "--watch",
        "--poll",
        "0.5",
        "--watch-timeout",
        "240",
        *args,
        env=env,
    )
    seconds = time.monotonic() - t0
    m = re.search(r"submitted job (\d+)", done.stderr)
    assert m, f"no job submitted:\n{done.stdout}\n{done.stderr}"
    print(f"\n[conformance] {launcher} {Path(args[0]).name}: job {m.group(1)} in {seconds:.1f}s")
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    return m.group(1), done.stdout, seconds


@pytest.mark.slurm
@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
@pytest.mark.parametrize("style", STYLES)
def test_style_under_slurm(slurm_cluster, tmp_path, style, launcher):
    # The heavy imports (transformers, deepspeed) run one rank per node; the DDP styles two.
    per_node = 1 if style in ("HF Trainer", "DeepSpeed") else 2
    world = 2 * per_node
    out = tmp_path / "out"
    job_id, stdout, _ = submit_watch(tmp_path, launcher, per_node, style_args(style, tmp_path, out))
    assert "COMPLETED" in stdout
    found = results(out, world)
    check_world(found, world, per_node)
    nodes = {r["env"]["SLURMD_NODENAME"] for r in found}
    assert nodes == {"n1", "n2"}, nodes  # the ranks really ran on both nodes
    if style != "elastic @record":  # every style that trains: every rank's steps, with no change to the script
        text = report_text(tmp_path, job_id)
        assert sorted(rank_rows(text)) == list(range(world)), text
        assert "the run failed" not in text and "no step records" not in text


@pytest.mark.slurm
@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_a_plain_scripts_straggler_is_named_in_a_slurm_jobs_report(slurm_cluster, tmp_path, launcher):
    """The straggler story on 2 nodes x 2 ranks, the script unchanged: rank 3's data loading 15 ms slower per batch
    is named, on its node, with its DataLoader, in the job's report (the job's environment reaches its ranks)."""
    out = tmp_path / "out"
    env = plain_env(tmp_path, out, STEPS="120", SLOW_RANK="3", SLOW_MS="15")
    job_id, _, _ = submit_watch(tmp_path, launcher, 2, [str(PLAIN)], env=env)
    text = report_text(tmp_path, job_id)
    assert sorted(rank_rows(text)) == [0, 1, 2, 3], text
    assert re.search(r"\[problem\] straggler: rank 3 on n[12] ", text), text
    assert "fetching its batches from the DataLoader" in text and "would take ~" in text, text
    assert not re.search(r"straggler: rank [012] ", text), text
