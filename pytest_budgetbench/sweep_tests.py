"""The sweep's test functions. pytest collects this module under the ``budgetbench``
node (see :mod:`pytest_budgetbench.collect`) and parametrizes each function the way it
parametrizes any test: ``cell`` once per cell, ``gate`` once per gate that was asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from pytest_budgetbench.errors import BudgetExceeded
from pytest_budgetbench.records import Status
from pytest_budgetbench.session import SESSION_KEY

if TYPE_CHECKING:
    from pytest_budgetbench.cells import GateVerdict
    from pytest_budgetbench.runner import CellResult

pytestmark = [pytest.mark.budgetbench]


def assert_within_budget(result: CellResult, *, gated: bool = False) -> None:
    """Fail a cell over budget. A reference strategy's violation is xfailed instead, and so
    is any violation when a --budgetbench-max-violation-rate gate judges them in aggregate.
    """
    __tracebackhide__ = True
    if result.status != Status.VIOLATION:
        return
    if result.reference:
        pytest.xfail(f"reference strategy over budget: {result.violation}")
    if gated:
        pytest.xfail(f"counted by --budgetbench-max-violation-rate: {result.violation}")
    raise BudgetExceeded(result.violation)




def cell(budget_cell: CellResult, request: pytest.FixtureRequest) -> None:
    """One cell: the prompt must have fit its budget."""
    __tracebackhide__ = True
    from pytest_budgetbench.progress import cell_properties

    # The progress line reads these off the report, in this process or through xdist.
    request.node.user_properties.extend(cell_properties(budget_cell))
    settings = request.config.stash[SESSION_KEY].settings
    assert_within_budget(budget_cell, gated=settings.max_violation_rate is not None)


def gate(budget_gate: GateVerdict) -> None:
    """One gate over the cells of one strategy@budget; fails with its one-line reason."""
    if not budget_gate.passed:
        pytest.fail(budget_gate.message or budget_gate.spec.gate_id, pytrace=False)
