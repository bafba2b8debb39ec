"""A launch option written after the script goes to the script: when the script (or a Python file beside it)
never names it, it was meant for trainscale, and the command refuses it in one line naming where it goes
(issue 38: `slurm --submit train.py --nproc-per-node 2` submitted a 1-rank job)."""

from __future__ import annotations

import pytest

from trainscale.cli.main import main


@pytest.mark.parametrize(
    "argv, said, hint",
    [
        (
            ["run", "train.py", "--nproc-per-node", "2"],
            "--nproc-per-node after train.py goes to train.py, which never reads it",
            "trainscale run --nproc-per-node ... train.py [ARGS]",
        ),
        (
            ["slurm", "--profile", "local-test", "-t", "5", "--dry-run", "train.py", "--nproc-per-node", "2"],
            "--nproc-per-node after train.py goes to train.py",
            "trainscale slurm --gpus-per-node N (ranks per node) ...",
        ),
        (
            ["slurm", "--profile", "local-test", "-t", "5", "--dry-run", "train.py", "-N", "2"],
            "-N after train.py",
            "trainscale slurm -N ... train.py [ARGS]",
        ),
        (["slurm", "--profile", "local-test", "--dry-run", "train.py", "--time=5"], "--time after train.py", "--time"),
    ],
)
def test_a_launch_option_after_a_script_that_never_reads_it_is_refused(in_tmp, capsys, argv, said, hint):
    (in_tmp / "train.py").write_text("import torch\nprint(torch.__version__)\n")
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert said in err and hint in err and len(err.strip().splitlines()) == 2, err


def test_a_script_that_reads_the_option_keeps_it(in_tmp, capsys):
    from trainscale.cli.run import SHAPING, _parser
    from trainscale.cli.split import misplaced_option, split_command

    parser = _parser()
    (in_tmp / "train.py").write_text("import argparse\np = argparse.ArgumentParser()\np.add_argument('--nnodes')\n")
    assert misplaced_option(parser, split_command(parser, ["train.py", "--nnodes", "2"]), SHAPING) is None
    (in_tmp / "args.py").write_text("NAMES = ['--nproc_per_node']\n")  # its parser in a sibling module: kept too
    assert misplaced_option(parser, split_command(parser, ["train.py", "--nproc-per-node", "2"]), SHAPING) is None
    assert (
        misplaced_option(parser, split_command(parser, ["train.py", "--max-restarts", "2"]), SHAPING)
        == "--max-restarts"
    )
    # a module's or a workload's arguments are not judged here
    assert misplaced_option(parser, split_command(parser, ["-m", "pkg.train", "--max-restarts", "2"]), SHAPING) is None
    assert (
        misplaced_option(
            parser,
            split_command(parser, ["--workload", "cnn", "--max-restarts", "2"], target_options=("--workload",)),
            SHAPING,
        )
        is None
    )


def test_the_word_alone_is_not_a_parser_reading_the_option(in_tmp):
    """`import time` reads no --time, `num_nodes` no --nodes; a dataclass field (HfArgumentParser) or a package's
    parser below the script's directory does."""
    from trainscale.cli.slurm import SHAPING
    from trainscale.cli.slurm_options import parser as slurm_parser
    from trainscale.cli.split import misplaced_option, split_command

    parser = slurm_parser()
    (in_tmp / "train.py").write_text("import time\nnum_nodes = 2\nprint(time.time(), num_nodes)\n")
    line = ["--profile", "local-test", "--dry-run", "train.py", "--time", "5"]
    assert (
        misplaced_option(parser, split_command(parser, line, target_options=("--workload", "-m")), SHAPING) == "--time"
    )
    (in_tmp / "pkg").mkdir()
    (in_tmp / "pkg" / "args.py").write_text(
        "from dataclasses import dataclass\n@dataclass\nclass Args:\n    time: int = 5\n"
    )
    assert misplaced_option(parser, split_command(parser, line, target_options=("--workload", "-m")), SHAPING) is None
