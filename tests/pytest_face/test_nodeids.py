"""The plugin's node ids are built and read in one module,
:mod:`pytest_budgetbench.pytest_face.nodeids`."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pytest_budgetbench
from pytest_budgetbench.pytest_face import nodeids

ROOT = Path(pytest_budgetbench.__file__).parent


def test_a_cell_node_id_round_trips() -> None:
    nodeid = nodeids.sweep_nodeid(nodeids.CELL, "needle-0003-plain-512")
    assert nodeid == "budgetbench::cell[needle-0003-plain-512]"
    assert nodeids.is_cell_nodeid(nodeid) and not nodeids.is_gate_nodeid(nodeid)
    assert nodeids.params_of(nodeid) == "needle-0003-plain-512"
    assert nodeids.split(nodeid) == ("budgetbench", ("cell[needle-0003-plain-512]",))


def test_a_gate_node_id_is_in_the_gates_scope() -> None:
    nodeid = nodeids.sweep_nodeid(nodeids.GATE, "max-violation-rate plain@512")
    assert nodeids.is_gate_nodeid(nodeid) and not nodeids.is_cell_nodeid(nodeid)
    assert nodeid.startswith(nodeids.GATES_SCOPE + "[")
    assert nodeids.is_gate_name(nodeids.split(nodeid)[1][-1])


@pytest.mark.parametrize(("arg", "expected"), [
    ("budgetbench", ("budgetbench", ())),
    ("budgetbench::cell", ("budgetbench", ("cell",))),
    ("budgetbench::cell[a-b]@memory-0000", ("budgetbench", ("cell[a-b]",))),
    ("tests/test_x.py::test_y[a]", ("tests/test_x.py", ("test_y[a]",))),
])
def test_split_drops_an_old_xdist_group_suffix(arg: str, expected: tuple[str, tuple[str, ...]]
                                              ) -> None:
    assert nodeids.split(arg) == expected


def test_names_and_parameters() -> None:
    assert nodeids.function_of("cell[x-y]") == "cell"
    assert nodeids.function_of("gate") == "gate"
    assert nodeids.has_params("cell[x]") and not nodeids.has_params("cell")
    assert nodeids.params_of("tests/test_x.py::test_y") == ""
    assert nodeids.path_of("tests/test_x.py::test_y[a]") == "tests/test_x.py"
    assert nodeids.names_a_test("budgetbench::cell") and not nodeids.names_a_test("budgetbench")


def _code_strings(path: Path) -> list[tuple[int, str]]:
    """The string literals of ``path`` that are not docstrings."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docs = {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str)
            and id(node) not in docs]


WORKFLOW_COMMANDS = Path("reports") / "ci.py"
"""GitHub's workflow commands (``::error title=...::message``) are spelled there: their
``::`` is no node id's."""


def test_no_other_module_spells_a_node_id() -> None:
    """Tasks carry other projects' test ids as data; every other module asks nodeids."""
    spelled = [
        f"{path.relative_to(ROOT)}:{line}: {text!r}"
        for path in sorted(ROOT.rglob("*.py"))
        if path.name != "nodeids.py" and path.relative_to(ROOT).parts[0] != "tasks"
        and path.relative_to(ROOT) != WORKFLOW_COMMANDS
        for line, text in _code_strings(path)
        if ("::" in text and "::error" not in text)
        or text.startswith(("cell[", "gate[", "budgetbench::"))
    ]
    assert not spelled, "\n".join(spelled)
