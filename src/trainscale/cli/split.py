"""Split a command line into the launcher's own options, the target, and the target's arguments.

`trainscale run`, `trainscale slurm` and `trainscale bench` all take ``[OPTIONS] TARGET [ARGS...]``
where everything from the target on belongs to the user's script. Which options take a value is
read from the command's own argparse parser (never a hand-kept list), so a flag added to the parser
(or to torch's own torchrun parser, which `trainscale run` reuses) is split correctly at once.
"""

from __future__ import annotations

import argparse
import os
import re
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Split:
    options: list[str]
    """The command's own options, in order (still to be parsed by its parser)."""
    target_option: str | None
    """The option that named the target (e.g. ``--workload``), or None for a positional target."""
    target: str | None
    """The script, module or workload name; None when the line has none."""
    rest: list[str]
    """Everything after the target: the script's arguments."""


def _takes_value(action: argparse.Action) -> bool:
    return action.nargs != 0  # store_true/store_const/count/help/version have nargs == 0


def _lookup(parser: argparse.ArgumentParser, token: str) -> tuple[argparse.Action | None, bool]:
    """(the action ``token`` names, whether the token already carries its value)."""
    actions = parser._option_string_actions  # argparse keeps no public map from option strings to actions
    if token in actions:
        return actions[token], False
    if token.startswith("--") and "=" in token:
        name = token.split("=", 1)[0]
        action, _ = _lookup(parser, name)
        return action, action is not None
    if token.startswith("--") and parser.allow_abbrev:  # argparse accepts unique prefixes: so must we
        matches = {a for s, a in actions.items() if s.startswith("--") and s.startswith(token)}
        if len(matches) == 1:
            return matches.pop(), False
        return None, False
    if not token.startswith("--") and len(token) > 2 and token[:2] in actions:  # -r3: short option with its value
        action = actions[token[:2]]
        return action, _takes_value(action)
    return None, False


def split_command(
    parser: argparse.ArgumentParser,
    argv: list[str],
    *,
    target_options: tuple[str, ...] = (),
    double_dash: str = "target",
) -> Split:
    """Walk ``argv`` with ``parser``'s option table until the target.

    ``target_options`` name options whose value *is* the target (``--workload NAME``): everything
    after their value is the target's. A token that is not an option of ``parser`` and does not start
    with ``-`` is the target (a script path or module name). An unknown option is kept among the
    options, so the parser reports it by name. ``--`` either announces the target (``double_dash="target"``,
    as torchrun) or ends the options with no target, the rest being arguments (``"rest"``: bench's
    ``-- WORKLOAD ARGS``).
    """
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            rest = argv[i + 1 :]
            if double_dash == "rest":
                return Split(argv[:i], None, None, rest)
            return Split(argv[:i], None, rest[0] if rest else None, rest[1:])  # `-- train.py ...`
        if token.startswith("-") and token != "-":
            name = token.split("=", 1)[0]
            if name in target_options:
                if "=" in token:
                    return Split(argv[:i], name, token.split("=", 1)[1], argv[i + 1 :])
                return Split(argv[:i], name, argv[i + 1] if i + 1 < len(argv) else None, argv[i + 2 :])
            action, inline = _lookup(parser, token)
            i += 2 if action is not None and _takes_value(action) and not inline else 1
            continue
        return Split(argv[:i], None, token, argv[i + 1 :])
    return Split(list(argv), None, None, [])


def given_dests(parser: argparse.ArgumentParser, options: list[str], environ=None) -> frozenset[str]:
    """The dests of the options set on the line (``options``) or, torchrun's way, as ``PET_<DEST>``."""
    environ = os.environ if environ is None else environ
    found = set()
    for token in options:
        if token.startswith("-") and token != "-":
            action, _ = _lookup(parser, token)
            if action is not None:
                found.add(action.dest)
    for action in parser._actions:
        if action.option_strings and f"PET_{action.dest.upper()}" in environ:
            found.add(action.dest)
    return frozenset(found)


def misplaced_option(parser: argparse.ArgumentParser, split: Split, shaping: tuple[str, ...]) -> str | None:
    """The first option among the script's arguments that is one of the command's ``shaping`` options (those that
    shape the launch: nodes, ranks, time) when neither the script nor a Python file beside it mentions its name: it
    was meant for trainscale and would go to the script (``slurm --submit train.py --nproc-per-node 2`` once
    submitted a 1-rank job). A script that does read it (its name appears) keeps it; a module's or a workload's
    arguments are not judged here."""
    script = Path(split.target) if split.target and not split.target_option else None
    if script is None or not script.is_file():
        return None
    text: str | None = None
    for token in split.rest:
        name = token.split("=", 1)[0] if token.startswith("--") else token
        action = parser._option_string_actions.get(name) if token.startswith("-") else None
        strings = action.option_strings if action else [name] if name in shaping else []  # another launcher's
        if not set(strings) & set(shaping):
            continue
        if text is None:  # the script and the Python files below its directory (an args.py, a src/ package)
            files = [script, *sorted(p for p in script.parent.glob("**/*.py") if p != script)[:500]]
            text = "\n".join(f.read_text(errors="replace") for f in files).replace("-", "_")
        words = [s.lstrip("-").replace("-", "_") for s in strings if s.startswith("--")]
        # named as a parser names it: the flag itself, the quoted word (argparse's dest), or a dataclass field
        # (HfArgumentParser's); not the word anywhere ("import time", "runtime", "num_nodes" read no --time/--nodes)
        if not any(re.search(rf"(__{w}|['\"]{w}['\"])(?![A-Za-z0-9_])|^\s*{w}\s*:", text, re.M) for w in words):
            return name
    return None
