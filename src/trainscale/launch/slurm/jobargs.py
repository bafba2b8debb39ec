"""The script's arguments in the batch script: job-time variables expand, nothing else does (pure).

Each argument is one double-quoted word in which only ``$NAME``, ``${NAME}`` and arithmetic ``$(( ... ))``
of names and numbers expand (``\\$`` is a literal ``$``), so no command runs that you did not write; the
rules: docs/slurm.md, "Script arguments: job-time variables".
"""

from __future__ import annotations

import re
import shlex

_VAR = re.compile(
    r"\\\$|\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)"
    r"|\$\(\(([A-Za-z0-9_\s+\-*/%()]+)\)\)"
)
"""``\\$``, ``${NAME}``, ``$NAME``, and an arithmetic expansion of names, numbers and + - * / % ( ) only (the
workshop's ``--num-workers $(( SLURM_CPUS_PER_TASK / SLURM_GPUS_PER_NODE ))``): nothing that runs a command."""
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _escaped(text: str) -> str:
    """Literal inside double quotes: the four characters bash still reads there are escaped."""
    return re.sub(r'([\\"`$])', r"\\\1", text)


def job_word(arg: str) -> tuple[str, tuple[str, ...]]:
    """``arg`` as one shell word, and the variables it expands at job time."""
    if "$" not in arg:
        return shlex.quote(arg), ()
    out, names, pos = ['"'], [], 0
    for m in _VAR.finditer(arg):
        out.append(_escaped(arg[pos : m.start()]))
        if m.group(0) == "\\$":
            out.append("\\$")
        elif m.group(3) is not None:  # $(( ... )): expanded by the job's shell, as in a hand-written batch script
            out.append("$((" + m.group(3) + "))")
            names += _NAME.findall(m.group(3))
        else:
            name = m.group(1) or m.group(2)
            out.append("${" + name + "}")
            names.append(name)
        pos = m.end()
    out += [_escaped(arg[pos:]), '"']
    return "".join(out), tuple(names)


def job_words(args: tuple[str, ...] | list[str]) -> tuple[list[str], tuple[str, ...]]:
    """Every argument as a shell word, and every variable they expand (in order, once each)."""
    words, names = [], []
    for arg in args:
        word, used = job_word(arg)
        words.append(word)
        names += used
    return words, tuple(dict.fromkeys(names))


def check_lines(names: tuple[str, ...]) -> list[str]:
    """Batch-script lines that stop the job when an argument's variable is not set."""
    if not names:
        return []
    fix = (
        "hint: export it before submitting (sbatch passes your environment on), set it with --env NAME=VALUE "
        "or --setup, or write \\\\\\$ for a literal \\$"
    )
    return [
        "# The script's arguments expand these when the job runs (as in a hand-written batch script).",
        f"for var in {' '.join(names)}; do",
        '  if [ -z "${!var+x}" ]; then',
        '    echo "trainscale: error: the script\'s arguments use \\$$var, which is not set in the job" >&2',
        f'    echo "{fix}" >&2',
        "    exit 1",
        "  fi",
        "done",
    ]
