"""The exception tree: every error class of the package is in errors.py, under
BudgetBenchError, and its docstring draws the tree as the classes form it."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from pytest_budgetbench import errors

ROOT = Path(errors.__file__).parent
NOT_ERRORS = {"BudgetExceeded"}  # the budget assertion: an AssertionError, a test failure


def error_classes() -> dict[str, type[BaseException]]:
    return {name: value for name, value in vars(errors).items()
            if inspect.isclass(value) and issubclass(value, BaseException)
            and value.__module__ == errors.__name__}


def drawn_tree() -> dict[str, str | None]:
    """Each class of the docstring's tree -> the class it hangs under (None for the root)."""
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in (errors.__doc__ or "").splitlines():
        if not line.startswith("    "):  # the tree is indented; the prose around it is not
            continue
        words = line.replace("├──", " ").replace("└──", " ").replace("│", " ").split()
        depth = len(line) - len(line.lstrip(" │├└─"))
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[words[0]] = stack[-1][1] if stack else None
        stack.append((depth, words[0]))
    return parents


def test_the_docstring_draws_every_error_under_its_own_base() -> None:
    classes = error_classes()
    drawn = drawn_tree()
    assert set(drawn) == set(classes) - NOT_ERRORS
    for name, parent in drawn.items():
        base = classes[name].__bases__[0].__name__
        assert (parent or "Exception") == base, f"{name} is drawn under {parent}, not {base}"


def _exception_bases(node: ast.ClassDef) -> list[str]:
    names = [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases]
    return [name for name in names
            if name.endswith(("Error", "Exception", "Timeout", "Aborted", "Exceeded"))
            or name in error_classes()]


def test_no_error_class_is_defined_outside_errors_py() -> None:
    outside = []
    for path in sorted(ROOT.rglob("*.py")):
        if path.name == "errors.py" and path.parent == ROOT:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and _exception_bases(node):
                outside.append(f"{path.relative_to(ROOT)}: {node.name}")
    assert outside == []


def test_the_moved_errors_are_still_importable_where_they_were() -> None:
    from pytest_budgetbench.engine.preflight import NothingToRun
    from pytest_budgetbench.model.deadline import RequestTimeout
    from pytest_budgetbench.reports import ReportError
    from pytest_budgetbench.reports.load import ReportError as LoadReportError

    assert RequestTimeout is errors.RequestTimeout
    assert NothingToRun is errors.NothingToRun
    assert ReportError is LoadReportError is errors.ReportError
