"""The plugin's node ids, built and read here only.

pytest names the sweep's tests ``budgetbench::cell[<cell id>]`` and
``budgetbench::gate[<gate id>]`` (a budget search's ``budgetbench::search[<task> <strategy>]``);
a user's test over ``budget_cell`` is ``<path>::<name>[<cell id>]`` (or
``[...-<cell id>-...]`` beside other parameters). A command-line argument may end in an
old-style xdist loadgroup suffix (``...]@<group>``), which is ignored.
"""

from __future__ import annotations

import re

SEPARATOR = "::"
SWEEP_NODE = "budgetbench"
CELL = "cell"
GATE = "gate"
SEARCH = "search"
GATES_SCOPE = f"{SWEEP_NODE}{SEPARATOR}{GATE}"
"""The xdist scope every gate shares: they go out last, together."""

_GROUP_SUFFIX = re.compile(r"(?<=\])@[^\[\]]*$")


def sweep_nodeid(function: str, param: str) -> str:
    """``budgetbench::<function>[<param>]``: ``sweep_nodeid(CELL, cell.cell_id)``."""
    return f"{SWEEP_NODE}{SEPARATOR}{function}[{param}]"


def split(nodeid: str) -> tuple[str, tuple[str, ...]]:
    """A node id's path and its names below it (empty names dropped), without an xdist
    ``@group`` suffix: ``budgetbench::cell[x]`` is ``("budgetbench", ("cell[x]",))``."""
    path, *names = _GROUP_SUFFIX.sub("", nodeid).split(SEPARATOR)
    return path, tuple(n for n in names if n)


def path_of(nodeid: str) -> str:
    """The file or directory part of a node id (all of it when it names no test)."""
    return nodeid.split(SEPARATOR)[0]


def names_a_test(nodeid: str) -> bool:
    return SEPARATOR in nodeid


def function_of(test_name: str) -> str:
    """``cell[x]`` -> ``cell``; a name without parameters is its own function."""
    return test_name.split("[")[0]


def has_params(test_name: str) -> bool:
    return "[" in test_name


def params_of(nodeid: str) -> str:
    """What a parametrized node id's brackets hold (``""`` when it has none)."""
    return nodeid[nodeid.find("[") + 1 : -1] if nodeid.endswith("]") else ""


def is_cell_name(test_name: str) -> bool:
    return test_name.startswith(CELL + "[")


def is_gate_name(test_name: str) -> bool:
    return test_name.startswith(GATE + "[")


def is_search_name(test_name: str) -> bool:
    return test_name.startswith(SEARCH + "[")


def is_cell_nodeid(nodeid: str) -> bool:
    """``budgetbench::cell[...]``: a generated cell (not a user's test over its cells)."""
    return nodeid.startswith(f"{SWEEP_NODE}{SEPARATOR}{CELL}[")


def is_gate_nodeid(nodeid: str) -> bool:
    return nodeid.startswith(GATES_SCOPE + "[")
