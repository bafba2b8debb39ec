"""The rooms of docs/architecture.md hold: code outside strategies/ never branches on a strategy's name
or sets a strategy's fields (it asks the protocol), and the checkpoint layout is a leaf module."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import trainscale
from trainscale.strategies import REGISTRY

PACKAGE = Path(trainscale.__file__).parent


def _outside_strategies():
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] != "strategies":
            yield rel, ast.parse(path.read_text(), str(path))


def _names(node: ast.AST) -> set[str]:
    """Strategy names written as string constants in ``node`` (alone, or in a tuple/list/set)."""
    items = node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else [node]
    return {n.value for n in items if isinstance(n, ast.Constant) and n.value in REGISTRY}


def _about_a_strategy(node: ast.AST) -> bool:
    """``strategy.name``, ``opts.strategy``, ``run.strategy_args``, ``spec.split(":")[0]`` of those, ..."""
    return any(
        isinstance(n, ast.Attribute)
        and ("strategy" in n.attr or n.attr == "name")
        or isinstance(n, ast.Name)
        and "strategy" in n.id
        for n in ast.walk(node)
    )


def test_nothing_outside_strategies_branches_on_a_strategy_name():
    found = []
    for rel, tree in _outside_strategies():
        for node in ast.walk(tree):
            compared = []
            if isinstance(node, ast.Compare):
                compared = [node.left, *node.comparators]
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in ("startswith", "endswith")
            ):
                compared = [node.func.value, *node.args]
            names = set().union(*(_names(n) for n in compared)) if compared else set()
            if names and any(_about_a_strategy(n) for n in compared if not _names(n)):
                found.append(f"{rel}:{node.lineno} compares a strategy with {sorted(names)}")
    assert not found, "ask the strategy protocol instead:\n" + "\n".join(found)


def test_nothing_outside_strategies_sets_a_strategys_fields():
    fields = {"micro_batch_size", "gradient_accumulation_steps", "unit_modules", "storage"}
    found = [
        f"{rel}:{node.lineno} sets .{target.attr}"
        for rel, tree in _outside_strategies()
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AugAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Attribute) and target.attr in fields and _about_a_strategy(target.value)
    ]
    assert not found, "use strategy.with_batch(...) or the strategy's options:\n" + "\n".join(found)


def test_the_checkpoint_layout_is_a_leaf_module():
    tree = ast.parse((PACKAGE / "checkpoint" / "layout.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.startswith("trainscale")}, imported


CALLS_ITSELF_ALLOWED = {
    Path("launch/allocation.py"): "srun starts one `trainscale run` agent on each node of the allocation",
}
"""Where a `python -m trainscale` argv is a command line that runs elsewhere, not the library calling its own CLI."""


def test_no_module_launches_trainscales_own_command_line():
    """A short run is a trial (launch/trial.py, in this process, visible to the layer test), never a
    ``python -m trainscale run`` subprocess; a rendered batch script's text (``-m trainscale run`` in a string)
    is what the job runs, and not an argv."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.List, ast.Tuple)):
                words = [n.value if isinstance(n, ast.Constant) else None for n in node.elts]
                if (
                    any(a == "-m" and b == "trainscale" for a, b in itertools.pairwise(words))
                    and rel not in CALLS_ITSELF_ALLOWED
                ):
                    found.append(f"{rel}:{node.lineno}")
    assert not found, f"argv of `python -m trainscale` built in {found}: launch through launch/trial.py"


def test_observe_and_the_hang_watch_read_launch_facts_only_through_env():
    """issue 45: observe/ and the hang watch ask env.detect() (and env.node_name()) where a rank sits, never the
    launchers' own variables, which only env/ knows in every form (torchrun's, srun's, mpirun's)."""
    launchers = ("SLURM", "OMPI_", "PMI", "PALS_", "MPI_", "TORCHELASTIC_")
    own = {
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "NODE_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TRAINSCALE_RUN_DIR",
        "TRAINSCALE_JOB_DIR",
    }
    for path in sorted([*(PACKAGE / "observe").glob("*.py"), *(PACKAGE / "runtime" / "hangwatch").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert node.value not in own and not node.value.startswith(launchers), (path.name, node.value)
