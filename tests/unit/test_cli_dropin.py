"""The seeds' command lines, with `torchrun`/`sbatch` swapped for `trainscale run`/`trainscale slurm`, are
understood as torchrun and sbatch understand them (parsing and planning only; launches are in
tests/integration/test_run_cli.py and tests/conformance)."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest
import torch
from torch.distributed.elastic.multiprocessing import Std
from torch.distributed.run import get_args_parser

from trainscale.cli.main import main
from trainscale.cli.run import build_spec
from trainscale.errors import ConfigError
from trainscale.launch.local import launch_config, plan_rendezvous
from trainscale.launch.torchrun import defaults


@pytest.fixture
def script(tmp_path):
    path = tmp_path / "train_llm.py"
    path.write_text("print('hi')\n")
    return str(path)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_help_lists_every_torchrun_option(capsys):
    with pytest.raises(SystemExit) as done:
        main(["run", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    options = {
        s.replace("_", "-") for a in get_args_parser()._actions for s in a.option_strings if s not in ("-h", "--help")
    }  # each once: the _ spellings are said to work too
    assert len(options) > 25
    missing = sorted(o for o in options if o not in text)
    assert not missing, missing
    assert "--workload" in text and "--all-ranks" in text  # trainscale's own, listed apart


def test_run_help_is_short_and_a_mistaken_option_is_two_lines(capsys):
    """191 lines of help, 22 of them usage above a typo's error; now torchrun's options are named in one group
    (torchrun's own help describes them) and a typo is the error and the fix, as `plan` and `slurm` answer."""
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    text = capsys.readouterr().out
    assert len(text.splitlines()) <= 70 and "docs/launch.md" in text
    assert "Rendezvous backend endpoint" not in text  # torch's descriptions are torchrun --help's
    assert "--rdzv-timeout S  seconds to wait for every node" in text  # trainscale's own are described
    with pytest.raises(SystemExit) as exited:
        main(["run", "--nprocs-per-node", "2", "x.py"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "trainscale run: error: unrecognized arguments: --nprocs-per-node",
        "Hint: did you mean --nproc-per-node? `trainscale run --help` lists the options",
    ]


def test_seed_003_command_line(script, tmp_path):
    # torchrun --standalone --nnodes 1 --nproc-per-node gpu --redirects 3 --log-dir ../logs train_llm.py ...
    argv = [
        "--standalone",
        "--nnodes",
        "1",
        "--nproc-per-node",
        "gpu",
        "--redirects",
        "3",
        "--log-dir",
        str(tmp_path / "logs"),
        script,
        "--experiment-name",
        "x",
        "--batch-size",
        "64",
    ]
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match="--nproc-per-node gpu but no GPU is visible"):
            build_spec(argv)
        argv[4] = "2"
    spec = build_spec(argv)
    assert spec.args == ("--experiment-name", "x", "--batch-size", "64")
    assert spec.torchrun == {"standalone": True, "redirects": "3"} and spec.log_dir == tmp_path / "logs"
    config = launch_config(spec, spec.log_dir)
    # --redirects given: torchrun's own logging (files only, nothing teed to the console, no filter)
    assert config.logs_specs._redirects == Std.ALL and config.logs_specs._tee == Std.NONE
    assert config.logs_specs._local_ranks_filter is None
    assert config.rdzv_endpoint.startswith("127.0.0.1:") and config.rdzv_configs["is_host"] is True


def test_trainscale_console_when_no_logging_option_is_given(tmp_path, script):
    config = launch_config(build_spec(["--nproc-per-node", "2", script]), tmp_path / "logs")
    assert config.logs_specs._tee == Std.ALL and config.logs_specs._local_ranks_filter == {0}
    assert config.local_addr == "127.0.0.1" and config.role == "default"
    all_ranks = launch_config(build_spec(["--nproc-per-node", "2", "--all-ranks", script]), tmp_path / "logs")
    assert all_ranks.logs_specs._local_ranks_filter is None


def test_underscore_spellings_and_static_rendezvous_of_seed_002(tmp_path, script):
    # torchrun --nproc_per_node 8 --nnodes $SLURM_NNODES --node_rank $SLURM_PROCID
    #          --master_addr $MASTER_ADDR --master_port $MASTER_PORT ds_visualtransformer.py --deepspeed ...
    port = free_port()
    spec = build_spec(
        [
            "--nproc_per_node",
            "2",
            "--nnodes",
            "1",
            "--node_rank",
            "0",
            "--master_addr",
            "127.0.0.1",
            "--master_port",
            str(port),
            script,
            "--deepspeed",
        ]
    )
    assert spec.nproc_per_node == 2 and spec.args == ("--deepspeed",)
    config = launch_config(spec, tmp_path / "logs")
    # torch's static rendezvous, its store bound to the master address (launch/rendezvous.py)
    assert config.rdzv_backend == "trainscale-static" and config.rdzv_endpoint == f"127.0.0.1:{port}"
    assert config.rdzv_configs["rank"] == 0


@pytest.mark.parametrize(
    "flag, value, field, expected",
    [
        ("--monitor-interval", "0.5", "monitor_interval", 0.5),
        ("--monitor_interval", "0.5", "monitor_interval", 0.5),
        ("--start-method", "fork", "start_method", "fork"),
        ("--role", "trainer", "role", "trainer"),
        ("--local-addr", "127.0.0.1", "local_addr", "127.0.0.1"),
        ("--signals-to-handle", "SIGTERM,SIGUSR1", "signals_to_handle", "SIGTERM,SIGUSR1"),
        ("--shutdown-timeout", "7", "shutdown_timeout", 7),
        ("--max-restarts", "3", "max_restarts", 3),
        ("--event-log-handler", "null", "event_log_handler", "null"),
    ],
)
def test_torchrun_options_reach_the_launch_config(tmp_path, script, flag, value, field, expected):
    config = launch_config(build_spec([flag, value, "--nproc-per-node", "1", script]), tmp_path / "logs")
    assert getattr(config, field) == expected


def test_short_options_and_filters(tmp_path, script):
    config = launch_config(
        build_spec(["-r", "3", "-t", "1", "--local-ranks-filter", "0,1", "--nproc-per-node", "2", script]),
        tmp_path / "logs",
    )
    assert config.logs_specs._redirects == Std.ALL and config.logs_specs._tee == Std.OUT
    assert config.logs_specs._local_ranks_filter == {0, 1}
    config = launch_config(
        build_spec(["-r3", "--nproc-per-node", "1", script]), tmp_path / "logs"
    )  # -rVALUE, as argparse
    assert config.logs_specs._redirects == Std.ALL
    config = launch_config(
        build_spec(["--rdzv-conf", "timeout=5,join_timeout=6", "--standalone", script]), tmp_path / "l"
    )
    assert config.rdzv_configs["timeout"] == "5" and config.rdzv_configs["join_timeout"] == "6"
    with pytest.raises(ConfigError, match="is not a list of local ranks"):
        build_spec(["--local-ranks-filter", "zero", script])


def test_numa_binding_and_no_python_and_modules(script, tmp_path):
    spec = build_spec(["--numa-binding", "node", "--nproc-per-node", "1", script])
    assert spec.torchrun["numa_binding"] == "node" and launch_config(spec, tmp_path / "l").numa_options is not None
    prog = build_spec(["--no-python", "--nproc-per-node", "1", "true"])
    assert prog.no_python and prog.target == "true"
    assert build_spec(["-m", "json.tool", "--x"]).module and build_spec(["--module", "json.tool"]).target == "json.tool"
    assert build_spec(["--run-path", script]).target == script
    with pytest.raises(ConfigError, match="program 'no-such-program-x' does not exist"):
        build_spec(["--no-python", "no-such-program-x"])


def test_pet_variables_are_torchruns_fallbacks(script, monkeypatch):
    monkeypatch.setenv("PET_NPROC_PER_NODE", "3")
    monkeypatch.setenv("PET_ROLE", "from-env")
    spec = build_spec([script], environ=os.environ)
    assert spec.nproc_per_node == 3 and spec.torchrun["role"] == "from-env"
    assert build_spec(["--nproc-per-node", "1", script], environ=os.environ).nproc_per_node == 1  # the line wins


def test_nproc_words_mean_what_torchrun_means(script):
    cores = torch._utils.cpu_count() if hasattr(torch, "_utils") else os.cpu_count()
    assert build_spec(["--nproc-per-node", "cpu", script]).nproc_per_node == cores
    if not torch.cuda.is_available():
        assert build_spec(["--nproc-per-node", "auto", script]).nproc_per_node == cores
    with pytest.raises(ConfigError, match="is not a number or one of auto, cpu, gpu, xpu"):
        build_spec(["--nproc-per-node", "many", script])


def test_rendezvous_errors_name_the_fix(script):
    with pytest.raises(ConfigError, match="no --master-addr/--master-port"):
        plan_rendezvous(build_spec(["--nnodes", "2", script]), vars(defaults()))
    with pytest.raises(ConfigError, match="--rdzv-backend c10d with --nnodes 2 but no --rdzv-endpoint"):
        plan_rendezvous(build_spec(["--nnodes", "2", "--rdzv-backend", "c10d", script]), vars(defaults()))
    with pytest.raises(ConfigError, match="a standalone rendezvous is one node"):
        plan_rendezvous(build_spec(["--standalone", "--nnodes", "2", script]), vars(defaults()))


def test_log_dir_that_is_a_file_is_refused_in_one_line_before_launch(script, tmp_path, capsys):
    taken = tmp_path / "notes.txt"
    taken.write_text("mine")
    for given, message in ((taken, "is a file, not a directory"), (taken / "logs", "which is a file")):
        assert main(["run", "--log-dir", str(given), script]) == 2
        err = capsys.readouterr().err
        assert message in err and "Hint:" in err and "Traceback" not in err, err
    assert taken.read_text() == "mine"


def test_unknown_option_is_named(script, capsys):
    with pytest.raises(SystemExit):
        build_spec(["--nproc-per-nod3", "2", script])
    assert "--nproc-per-nod3" in capsys.readouterr().err


# ---------------------------------------------------------------------------- trainscale slurm, sbatch's spelling


@pytest.fixture
def job_script(tmp_path):
    path = tmp_path / "cnn_multinode.py"
    path.write_text("print('hi')\n")
    return str(path)


def slurm_spec(argv, environ=None):
    from trainscale.cli.slurm import build

    return build(argv, environ or {})[0]


def test_sbatch_short_options(job_script):
    with open(job_script, "a") as fh:  # a script with its own -N: what follows it is its own
        fh.write("\nimport argparse\nargparse.ArgumentParser().add_argument('-N', '--nodes', type=int)\n")
    spec = slurm_spec(
        [
            "--profile",
            "lumi",
            "-N",
            "2",
            "-t",
            "1:00:00",
            "-A",
            "proj",
            "-p",
            "standard-g",
            "-J",
            "exp",
            "-c",
            "7",
            "-q",
            "normal",
            "-C",
            "nvme",
            "-o",
            "out-%j.log",
            "-e",
            "err-%j.log",
            "-d",
            "afterok:1",
            "-a",
            "0-3%1",
            "-D",
            "/tmp",
            "--dry-run",
            job_script,
            "-N",
            "5",
        ]
    )
    assert (spec.nodes, spec.time, spec.account, spec.partition, spec.job_name) == (
        2,
        "1:00:00",
        "proj",
        "standard-g",
        "exp",
    )
    assert (spec.cpus_per_task, spec.qos, spec.constraint, spec.output, spec.error) == (
        7,
        "normal",
        "nvme",
        "out-%j.log",
        "err-%j.log",
    )
    assert (spec.dependency, spec.array, spec.chdir) == ("afterok:1", "0-3%1", "/tmp")
    assert spec.args == ("-N", "5")  # after the script: the script's own


def test_ntasks_and_typed_gpus(job_script):
    from trainscale.launch.slurm import resolve
    from trainscale.profiles import load_profile

    spec = slurm_spec(
        ["--profile", "generic-nvidia", "-N", "2", "-n", "8", "-t", "10", "--launcher", "srun", "--dry-run", job_script]
    )
    assert resolve(spec, load_profile("generic-nvidia")).ranks_per_node == 4
    typed = slurm_spec(
        ["--profile", "generic-nvidia", "--gpus-per-node", "a100:4", "-t", "10", "--dry-run", job_script]
    )
    assert (typed.gpu_type, typed.gpus_per_node) == ("a100", 4)
    with pytest.raises(ConfigError, match="is not N or TYPE:N"):
        slurm_spec(["--gpus-per-node", "four", "-t", "10", "--dry-run", job_script])


def test_the_hang_timeout_goes_to_the_jobs_workers_in_the_batch_script(job_script):
    from trainscale.launch.slurm import render
    from trainscale.profiles import load_profile

    spec = slurm_spec(
        ["--profile", "generic-nvidia", "-t", "10", "--env", "A=1", "--hang-timeout", "120", "--dry-run", job_script]
    )
    assert spec.env == {"A": "1", "TRAINSCALE_HANG_TIMEOUT": "120"}
    assert "export TRAINSCALE_HANG_TIMEOUT=120" in render(spec, load_profile("generic-nvidia"))
    with pytest.raises(ConfigError, match=r"--hang-timeout -5 must be 0 \(never\) or more seconds"):
        slurm_spec(["-t", "10", "--hang-timeout", "-5", "--dry-run", job_script])


def test_config_file_then_environment_then_command_line(tmp_path, job_script):
    from trainscale.cli.slurm import build

    config = tmp_path / "job.toml"
    config.write_text(
        '[slurm]\nprofile = "lumi"\naccount = "from-file"\ntime = "00:30:00"\n'
        'modules = ["use /appl/local/containers/ai-modules", "load singularity-AI-bindings"]\n'
        'setup = ["source /project/p/venv/bin/activate"]\n'
    )
    spec = slurm_spec(["--config", str(config), "--dry-run", job_script], {"TRAINSCALE_SLURM_ACCOUNT": "from-env"})
    assert spec.profile == "lumi" and spec.account == "from-env" and spec.time == "00:30:00"
    assert spec.modules == ("use /appl/local/containers/ai-modules", "load singularity-AI-bindings")
    assert spec.setup == ("source /project/p/venv/bin/activate",)
    spec = slurm_spec(
        ["--config", str(config), "-A", "from-line", "--module", "load X", "--dry-run", job_script],
        {"TRAINSCALE_SLURM_ACCOUNT": "from-env"},
    )
    assert spec.account == "from-line" and spec.modules == ("load X",)  # a later source replaces the whole list
    spec, profile, _, _ = build(
        ["--config", str(config), "--dry-run", job_script], {"TRAINSCALE_SLURM_PROFILE": "cyclone"}
    )
    assert spec.profile == profile.name == "cyclone"  # the profile's name too: the environment beats the file
    assert (
        build(
            ["--config", str(config), "--profile", "local-test", "--dry-run", job_script],
            {"TRAINSCALE_SLURM_PROFILE": "cyclone"},
        )[1].name
        == "local-test"
    )
    config.write_text('[slurm]\nacount = "typo"\ntime = "5"\n')
    with pytest.raises(ConfigError, match="unknown slurm option 'acount'") as err:
        slurm_spec(["--config", str(config), "--dry-run", job_script])
    assert "account" in err.value.hint
    with pytest.raises(ConfigError, match="--time is required"):
        slurm_spec(["--dry-run", job_script])


def _fake_sbatch(directory: Path, answer: str, code: int) -> None:
    sbatch = directory / "sbatch"
    sbatch.write_text(f"#!/bin/sh\necho '{answer}' >&2\nexit {code}\n")
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IEXEC)


def test_dry_run_asks_the_scheduler_when_sbatch_is_there(tmp_path, job_script, monkeypatch, capsys):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_sbatch(bin_dir, "sbatch: Job 99 to start at 2026-11-23T14:00:00 using 8 processors on nodes n1", 0)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    argv = ["slurm", "--profile", "local-test", "-N", "2", "-t", "5", "--output-dir", str(tmp_path / "jobs")]
    assert main([*argv, "--dry-run", job_script]) == 0
    captured = capsys.readouterr()
    assert captured.out.startswith("#!/bin/bash")
    assert "sbatch --test-only accepts the job: sbatch: Job 99 to start at" in captured.err
    _fake_sbatch(
        bin_dir, "sbatch: error: Batch job submission failed: Requested node configuration is not available", 1
    )
    assert main([*argv, "--test-only", job_script]) == 1  # as sbatch --test-only: not accepted, not 0
    assert "REFUSES the job: sbatch: error: Batch job submission failed" in capsys.readouterr().err
    assert not (tmp_path / "jobs").exists()  # neither wrote a script or submitted


def test_submitting_a_script_does_not_import_torch(tmp_path, job_script):
    """`trainscale slurm --submit script.py` writes a run directory and calls sbatch: torch's import (2-3 CPU-s,
    most of a submission) is the job's, not the submitting command's. sbatch is faked (the real one:
    tests/slurm); the submission record still names the installed torch."""
    import json
    import subprocess
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"
    sbatch.write_text(
        '#!/bin/sh\ncase "$*" in *--parsable*) echo 4242 ;; '
        "*) echo 'sbatch: Job 99 to start at 2026-11-23T14:00:00' >&2 ;; esac\n"
    )
    sbatch.chmod(sbatch.stat().st_mode | stat.S_IEXEC)
    probe = (
        "import sys\nfrom trainscale.cli.main import main\n"
        f"code = main(['slurm', '--profile', 'local-test', '-N', '2', '-t', '5', '--output-dir', 'jobs', "
        f"'--submit', {job_script!r}])\nprint('exit', code, 'torch' in sys.modules)"
    )
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env
    )
    assert done.stdout.splitlines()[-1] == "exit 0 False", done.stdout[-2000:] + done.stderr[-2000:]
    assert "submitted job 4242" in done.stderr
    record = json.loads((tmp_path / "jobs" / "latest" / "submission.json").read_text())
    assert record["versions"]["torch"] == torch.__version__


def test_test_only_needs_sbatch(tmp_path, job_script, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="--test-only needs sbatch"):
        import argparse

        from trainscale.cli.slurm import run as slurm_run

        slurm_run(argparse.Namespace(argv=["--profile", "local-test", "-t", "5", "--test-only", job_script]))
    # --dry-run where there is no scheduler: it says the job was not checked, and it is no failure
    assert slurm_run(argparse.Namespace(argv=["--profile", "local-test", "-t", "5", "--dry-run", job_script])) == 0
    assert (
        "no SLURM scheduler here (sbatch is not on PATH): the job was not checked by SLURM" in capsys.readouterr().err
    )
