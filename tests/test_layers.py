"""The package's imports form layers: every import points down, and none forms a cycle.

Read from the package's own source with ``ast``, so a lazy import inside a function counts
as much as one at the top of a module; only imports under ``if TYPE_CHECKING:`` are left
out, since they never run.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import pytest_budgetbench

PACKAGE = "pytest_budgetbench"
ROOT = Path(pytest_budgetbench.__file__).parent

# Lowest first. A module's layer is that of the longest prefix listed here.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("messages", "errors", "records", "definition", "deadline", "lexicon", "redact", "registry",
     "options", "gguf_models"),
    ("budget", "framing", "model", "endpoint", "aux_model", "launcher", "cache", "embeddings",
     "config", "cells"),
    ("tasks", "strategies", "reports", "testing"),
    ("declared", "catalog", "runner"),
    ("session", "wiring", "train_environment", "regrade", "preflight"),
    ("progress", "failures", "arguments"),
    ("sweep_tests",),
    ("collect",),
    ("plugin", "cli", "train_router"),
)
# Subpackages of one layer that must not import one another.
SIBLINGS = ("tasks", "strategies", "reports")
# The sanctioned crossings: report extensions of strategy families build on the reports layer.
ALLOWED_CROSSINGS = {("strategies.budgetmem.report", "reports"),
                     ("strategies.memory_report", "reports")}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _under_type_checking(node: ast.AST, parents: dict[ast.AST, ast.AST]) -> bool:
    while node in parents:
        node = parents[node]
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return True
    return False


def imports_of(path: Path) -> set[str]:
    """The package modules ``path`` imports (relative to the package, '' for the root)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    found: set[str] = set()
    for node in ast.walk(tree):
        if _under_type_checking(node, parents):
            continue
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            if name == PACKAGE or name.startswith(PACKAGE + "."):
                target = name[len(PACKAGE) + 1:]
                if target and _exists(target):
                    found.add(target)
    return found


def _exists(module: str) -> bool:
    base = ROOT.joinpath(*module.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def layer_of(module: str) -> int:
    best, layer = -1, -1
    for index, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > best:
                best, layer = len(name), index
    return layer


GRAPH = {
    module_name(path): imports_of(path) - {module_name(path)}
    for path in sorted(ROOT.rglob("*.py"))
}


def test_every_module_has_a_layer() -> None:
    unplaced = sorted(m for m in GRAPH if m and layer_of(m) < 0)
    assert not unplaced, f"add these modules to LAYERS: {unplaced}"


def test_imports_point_down() -> None:
    upward = [
        f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})"
        for module, targets in GRAPH.items() if module
        for target in targets if target and layer_of(target) > layer_of(module)
    ]
    assert not upward, "\n".join(upward)


def test_tasks_strategies_and_reports_do_not_import_each_other() -> None:
    crossings = []
    for module, targets in GRAPH.items():
        home = module.split(".")[0]
        for target in targets:
            there = target.split(".")[0]
            if home in SIBLINGS and there in SIBLINGS and home != there and not any(
                module.startswith(src) and there == dst for src, dst in ALLOWED_CROSSINGS
            ):
                crossings.append(f"{module} imports {target}")
    assert not crossings, "\n".join(crossings)


def _cycle() -> list[str] | None:
    """A cycle among modules, parent packages excluded (a package's __init__ importing its
    own submodules is how a package exposes them, not a cycle)."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        stack.append(module)
        for target in sorted(GRAPH.get(module, ())):
            if module.startswith(target + ".") or not target:
                continue
            if state.get(target) == 1:
                return [*stack[stack.index(target):], target]
            if target not in state and (found := visit(target)):
                return found
        stack.pop()
        state[module] = 2
        return None

    for module in sorted(GRAPH):
        if module not in state and (found := visit(module)):
            return found
    return None


def test_no_import_cycle() -> None:
    cycle = _cycle()
    assert cycle is None, " -> ".join(cycle or [])


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    """The graph is read from source: a planted lazy upward import is found."""
    planted = tmp_path / "mod.py"
    planted.write_text("def f():\n    from pytest_budgetbench import plugin\n")
    assert imports_of(planted) == {"plugin"}
    guarded = tmp_path / "typed.py"
    guarded.write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
        "    from pytest_budgetbench import plugin\n"
    )
    assert imports_of(guarded) == set()


@pytest.mark.parametrize("module", ["plugin", "runner", "budget"])
def test_known_modules_are_placed(module: str) -> None:
    assert layer_of(module) >= 0
