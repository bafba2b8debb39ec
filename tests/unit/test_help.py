"""Every option of every subcommand says what it does in ``--help`` (issue 21 item 8), and each command's help is
its own (`sweep --help` once printed `trainscale slurm`'s)."""

from __future__ import annotations

import argparse

import pytest

from trainscale.cli import bench, slurm_options, sweep, tune
from trainscale.cli.main import build_parser, main
from trainscale.launch.torchrun import parser as torchrun_parser
from trainscale.train.options import add_common_arguments


def undescribed(parser: argparse.ArgumentParser, path: str) -> list[str]:
    out = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out += undescribed(sub, f"{path} {name}")
        elif isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
            continue
        elif action.dest == "argv":  # a raw command: its own parser is checked below
            continue
        elif not action.help:  # SUPPRESS: hidden on purpose, described in the command's text
            out.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
    return out


def workload_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_common_arguments(p)
    return p


PARSERS = {
    "trainscale": build_parser,
    "trainscale run (torchrun's options)": torchrun_parser,
    "trainscale run --workload": workload_parser,
    "trainscale slurm": slurm_options.parser,
    "trainscale sweep": sweep.sweep_parser,
    "trainscale bench": bench._parser,
    "trainscale plan --tune": tune._parser,
}


@pytest.mark.parametrize("name", list(PARSERS))
def test_every_option_is_described(name):
    assert undescribed(PARSERS[name](), name) == []


def exit_code(argv: list[str]) -> int | None:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own --help
        return exc.code


@pytest.mark.parametrize(
    "argv, own",
    [
        (["sweep", "--help"], "trainscale sweep"),
        (["bench", "--help"], "--configs CONFIGS"),
        (["bench", "allreduce", "--help"], "--iters ITERS"),
        (["plan", "--tune", "--help"], "--budget BUDGET"),
        (["run", "--workload", "gpt", "--help"], "--seq-len SEQ_LEN"),
        (["sweep", "status", "--help"], "--metric"),
    ],
)
def test_each_command_prints_its_own_help(capsys, argv, own):
    assert exit_code(argv) in (0, None)
    out = capsys.readouterr().out
    assert own in out and "usage: trainscale slurm" not in out


def helps(parser: argparse.ArgumentParser):
    yield parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from helps(sub)


@pytest.mark.parametrize("name", list(PARSERS))
def test_no_help_text_says_none(name):
    """Python's None leaked into 12 help strings ("None: the profile's default"); on a command line it is the
    option not given (issue 38 item 2)."""
    said = [line.strip() for text in helps(PARSERS[name]()) for line in text.splitlines() if "None" in line]
    assert said == []


@pytest.mark.parametrize(
    "argv, hint",
    [
        (
            ["run", "--workload", "cnn", "--nproc-per-node", "2"],
            "Hint: --nproc-per-node: launch option(s) go before --workload",
        ),
        (["slurm", "--bogus"], "Hint: `trainscale slurm --help` lists its options"),
        (["bench", "--bogus"], "Hint: `trainscale bench --help` lists its options"),
        (["nonsense"], "Hint: `trainscale --help` lists its options"),
    ],
)
def test_a_command_line_mistake_is_one_line_and_a_hint_without_the_usage(capsys, argv, hint):
    """issue 38 item 2: argparse's errors came after 10-26 lines of usage, with no fix named (a launch option
    after --workload: 26 lines, then "unrecognized arguments")."""
    if argv[0] == "run":  # the workload's own parser, as the launcher's preflight and each rank run it
        from trainscale.workloads import cnn

        with pytest.raises(SystemExit) as ended:
            cnn.main(argv[2:])
        code = ended.value.code
    else:
        code = exit_code(argv)
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 2, err
    assert ": error: " in err[0] and err[1].startswith(hint) and "usage:" not in "\n".join(err)
