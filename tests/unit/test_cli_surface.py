"""The command surface stays one a user can hold in their head (docs/architecture.md, "The command surface"):
at most ten commands, each with a description and examples in its --help; the merged ones' acts refused
in one line when they are given without what they act on."""

from __future__ import annotations

import argparse

import pytest

from trainscale.cli.main import SUBCOMMANDS, build_parser, main


def test_ten_commands_or_fewer_each_listed_in_the_architecture_doc():
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "architecture.md").read_text()
    assert len(SUBCOMMANDS) <= 10
    parser = build_parser()
    listed = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert set(listed) == set(SUBCOMMANDS)
    for name in SUBCOMMANDS:
        assert f"| `{name}` |" in doc, f"docs/architecture.md's command table lacks {name}"


@pytest.mark.parametrize("name", ["workloads", "logs", "cancel", "attach", "bind"])
def test_a_merged_command_is_unknown_with_the_commands_listed(name, capsys):
    with pytest.raises(SystemExit) as exited:
        main([name])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) <= 2 and "invalid choice" in err and "jobs" in err, err


@pytest.mark.parametrize(
    "argv, said",
    [
        (["jobs", "--rank", "1"], "--rank needs a job"),
        (["jobs", "--cancel"], "--cancel needs a job"),
        (["jobs", "12", "--all"], "--all lists every user's queue; it takes no job"),
        (["jobs", "12", "--cancel", "--attach"], "--cancel and --attach together"),
        (["jobs", "12", "--tail", "5", "--signal", "USR1"], "--tail reads a job's output; --signal acts on it"),
        (["jobs", "12", "--node", "n1"], "--node and a command are for --attach"),
        (["jobs", "12", "--", "hostname"], "--node and a command are for --attach"),
    ],
)
def test_jobs_refuses_what_does_not_go_together(argv, said, capsys):
    assert main(argv) == 2
    assert said in capsys.readouterr().err


def test_run_help_lists_the_workloads(capsys):
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    out = capsys.readouterr().out
    assert "Built-in workloads (--workload NAME):" in out and "hf-finetune" in out and "seed 004's CNN" in out


@pytest.mark.parametrize("name", SUBCOMMANDS)
def test_every_command_has_examples_in_its_help(name, capsys):
    try:
        code = main([name, "--help"])  # a command that parses its own line returns; argparse's own exits
    except SystemExit as exited:
        code = exited.code
    assert code == 0 and "xamples" in capsys.readouterr().out
