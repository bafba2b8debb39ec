"""`trainscale run` end to end: real elastic agent, real worker processes, real gloo."""

from __future__ import annotations

import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch
from helpers.cli import in_process

from trainscale.cli.main import main

FAST_CNN = ["--data", "synthetic", "--samples", "256", "--batch-size", "16", "--log-every", "0"]


def trainscale(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`trainscale ARGS` in ``cwd``: what is under test here is the launch, not the launcher's own process."""
    return in_process(*args, cwd=cwd)


def test_two_ranks_exit_zero_with_a_log_per_rank_and_rank0_on_console(tmp_path):
    proc = trainscale(
        "run",
        "--nproc-per-node",
        "2",
        "--log-dir",
        "logs",
        "--workload",
        "cnn",
        "--max-steps",
        "4",
        *FAST_CNN,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    console = proc.stdout + proc.stderr
    assert "[rank0]:" in console and "2 rank(s) x batch 16" in console
    assert "[rank1]:" not in console
    stdout_logs = sorted(p for p in tmp_path.glob("logs/*/attempt_0/*/stdout.log") if "latest" not in p.parts)
    assert [p.parent.name for p in stdout_logs] == ["0", "1"]
    assert all(p.stat().st_size > 0 for p in stdout_logs[:1])


def test_all_ranks_flag_prefixes_every_rank(tmp_path):
    script = tmp_path / "hello.py"
    script.write_text("import os; print('hello from', os.environ['RANK'])\n")
    proc = trainscale("run", "--nproc-per-node", "2", "--all-ranks", "--log-dir", "logs", str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "[rank0]:hello from 0" in proc.stdout.replace(" ", " ") or "[rank0]: hello from 0" in proc.stdout
    assert "hello from 1" in proc.stdout


def test_failing_rank_is_named_with_its_traceback(tmp_path):
    """A plain torchrun-style script without @record: the summary still has the traceback."""
    script = tmp_path / "fails.py"
    script.write_text(
        textwrap.dedent("""
        import os
        import torch.distributed as dist

        def load_shard(rank):
            if rank == 1:
                raise ValueError("shard 1 is corrupt")

        dist.init_process_group("gloo")
        load_shard(dist.get_rank())
        dist.barrier()
        dist.destroy_process_group()
    """)
    )
    proc = trainscale("run", "--nproc-per-node", "2", "--log-dir", "logs", str(script), cwd=tmp_path)
    assert proc.returncode != 0
    assert "first failing rank: 1" in proc.stderr
    assert "ValueError: shard 1 is corrupt" in proc.stderr
    assert "load_shard" in proc.stderr  # the traceback, not just the message
    # the summary alone: rank 0's "Connection closed by peer" traceback stays in its log, one line says why it ended
    assert proc.stderr.index("=" * 72) < proc.stderr.index("Traceback"), proc.stderr
    assert "Connection closed" not in proc.stderr and "GLHF" not in proc.stderr, proc.stderr  # gloo's own words
    assert re.search(
        r"\n  rank 0 on \S+: stopped after rank 1 failed \((connection (closed|reset) by peer|"
        r"broken pipe|killed by SIGTERM)\)\n",
        proc.stderr,
    ), proc.stderr
    # the traceback starts at the user's code: none of the launcher's own frames (bootstrap, runpy)
    traceback = proc.stderr.split("Traceback of rank 1:\nTraceback (most recent call last):\n")[1]
    assert traceback.startswith(f'  File "{script}", line 10, in <module>'), traceback
    assert "bootstrap.py" not in proc.stderr and "runpy" not in proc.stderr, proc.stderr


def _final_weights(ckpt_dir: Path) -> dict[str, torch.Tensor]:
    newest = sorted(ckpt_dir.glob("ckpt-*.pt"))[-1]
    return torch.load(newest, weights_only=True)["model"]


def test_resume_after_epoch_two_equals_uninterrupted_run_bitwise_and_continues_on_another_world_size(tmp_path):
    common = ["run", "--nproc-per-node", "2", "--log-dir", "logs", "--workload", "cnn", *FAST_CNN]
    first = trainscale(*common, "--epochs", "2", "--checkpoint-dir", "resumed", cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    shutil.copytree(tmp_path / "resumed", tmp_path / "grown")
    # an end-of-epoch checkpoint from 2 ranks continues on 1 rank
    grown = trainscale(
        *common[:1], "--nproc-per-node", "1", *common[3:], "--epochs", "3", "--checkpoint-dir", "grown", cwd=tmp_path
    )
    assert grown.returncode == 0, grown.stderr
    assert "written with world size 2, now 1" in grown.stdout
    second = trainscale(*common, "--epochs", "4", "--checkpoint-dir", "resumed", cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "Resumed from" in second.stdout and "epoch 3" in second.stdout
    assert "; verified 1 file(s)" in second.stdout  # the resume checked the file against its manifest
    straight = trainscale(*common, "--epochs", "4", "--checkpoint-dir", "straight", cwd=tmp_path)
    assert straight.returncode == 0, straight.stderr
    resumed, reference = _final_weights(tmp_path / "resumed"), _final_weights(tmp_path / "straight")
    assert resumed.keys() == reference.keys()
    for key in reference:
        assert torch.equal(resumed[key], reference[key]), key


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--nproc-per-node", "0", "--workload", "cnn"], "at least one process per node"),
        (["--nproc-per-node", "two", "--workload", "cnn"], "is not a number"),
        (["--nproc-per-node", "2", "no_such_script.py"], "does not exist"),
        (["--nproc-per-node", "2", "--workload", "cnn", "--batch-size", "0"], "--batch-size 0 must be >= 1"),
        (
            [
                "--nproc-per-node",
                "4",
                "--workload",
                "cnn",
                "--data",
                "synthetic",
                "--samples",
                "40",
                "--batch-size",
                "16",
            ],
            "need at least 64",
        ),
        (["--nproc-per-node", "2", "--workload", "cnnn"], "did you mean 'cnn'"),
        (["--nproc-per-node", "2", "--workload", "cnn", "--data", "imagenet"], "unknown data source"),
        (["--nproc-per-node", "2"], "nothing to run"),
    ],
)
def test_bad_input_is_refused_before_any_process_starts(in_tmp, capsys, argv, message):
    code = main(["run", "--log-dir", "logs", *argv])
    err = capsys.readouterr().err
    assert code == 2
    assert message in err and "Hint:" in err
    assert not (in_tmp / "logs").exists()  # nothing was launched


@pytest.mark.parametrize(
    "strategy, message",
    [
        ("fsdpp", "did you mean 'fsdp'"),
        ("deepspeed:config=missing_ds_config.json", "missing_ds_config.json"),
    ],
)
def test_bad_strategy_is_refused_before_launch(in_tmp, capsys, strategy, message):
    code = main(["run", "--log-dir", "logs", "--nproc-per-node", "2", "--workload", "cnn", "--strategy", strategy])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Hint:" in err
    assert not (in_tmp / "logs").exists()


def test_ds_config_with_unknown_stage_is_refused_before_launch(in_tmp, capsys):
    (in_tmp / "ds_config.json").write_text('{"train_micro_batch_size_per_gpu": 16, "zero_optimization": {"stage": 5}}')
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
            "deepspeed:config=ds_config.json",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "stage=5 is not a ZeRO stage" in err
    assert not (in_tmp / "logs").exists()


def test_resume_on_four_ranks_is_bitwise_too_and_a_mid_epoch_checkpoint_resumes_on_one_rank(tmp_path):
    """With 3+ ranks the all-reduce's rounding follows DDP's bucket layout; a resumed run must lay out
    its buckets as the uninterrupted run did (strategies/ddp.py::rebuild_buckets). The same mid-epoch checkpoint
    resumes on 1 rank: the rest of the epoch (the global cursor), the global batch kept by accumulation."""
    base = ["run", "--nproc-per-node", "4", "--log-dir", "logs", "--workload", "cnn", *FAST_CNN]
    assert (
        trainscale(
            *base, "--max-steps", "5", "--checkpoint-every", "5", "--checkpoint-dir", "r", cwd=tmp_path
        ).returncode
        == 0
    )
    shutil.copytree(tmp_path / "r", tmp_path / "mid")
    # a mid-epoch checkpoint (4 steps an epoch: step 5 is inside epoch 2) resumes on 1 rank: 3 steps of 4 x 16 left
    one = trainscale(
        *base[:1], "--nproc-per-node", "1", *base[3:], "--epochs", "2", "--checkpoint-dir", "mid", cwd=tmp_path
    )
    assert one.returncode == 0, one.stderr
    assert "global batch 64 kept on 1 rank(s) (the checkpoint's 4): gradient accumulation 4 x batch 16" in one.stdout
    assert "at step 5 (epoch 2, 64 of its 256 samples done)" in one.stdout, one.stdout
    assert "step 8/8" in one.stdout  # 5 + the epoch's 3 steps left
    resumed = trainscale(*base, "--max-steps", "12", "--checkpoint-dir", "r", cwd=tmp_path)
    assert resumed.returncode == 0 and "Resumed from" in resumed.stdout, resumed.stderr
    straight = trainscale(*base, "--max-steps", "12", "--checkpoint-dir", "s", cwd=tmp_path)
    assert straight.returncode == 0, straight.stderr
    a, b = _final_weights(tmp_path / "r"), _final_weights(tmp_path / "s")
    for key in b:
        assert torch.equal(a[key], b[key]), key


def test_a_trainscale_refusal_inside_the_ranks_is_one_line_not_a_traceback(tmp_path):
    """A mistake trainscale catches only once the ranks run (here rt.resume given an entry named like its
    own) reads as it would before launch: the message and its fix on one line, on the console and in the
    summary; the stack stays in the rank's error file for whoever wants it."""
    (tmp_path / "train.py").write_text(
        textwrap.dedent("""
        import torch
        import trainscale

        rt = trainscale.init()
        model = torch.nn.Linear(2, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        start = rt.resume(model, opt, step=3)
    """)
    )
    proc = trainscale("run", "--nproc-per-node", "2", "--log-dir", "logs", "train.py", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    # both ranks refuse; whether the launcher saw one or both end before it stopped the other is timing
    summary = [
        line
        for line in proc.stderr.splitlines()
        if re.match(r"trainscale: (rank [01]|ranks 0-1) stopped: ConfigError: ", line)
    ]
    assert len(summary) == 1 and "own checkpoint entries (hint: " in summary[0], proc.stderr
    # rank 0's own echo of that line ("[rank0]: trainscale: error: ConfigError: ...") is on the console only
    # when rank 0 refused before the launcher stopped it (the console shows local rank 0 alone; when rank 1
    # refuses first, it has none): the summary line above is what the run promises
    (run,) = [p for p in (tmp_path / "logs").iterdir() if not p.is_symlink()]
    errors = list(run.glob("attempt_0/*/error.json"))
    assert errors and all("Traceback" in e.read_text() for e in errors)
    assert f"trainscale: next: trainscale report logs/{run.name}" in proc.stderr
