"""The sweep's test functions. pytest collects this module under the ``budgetbench``
node (see :mod:`pytest_budgetbench.pytest_face.collect`) and parametrizes each function the way it
parametrizes any test: ``cell`` once per cell, ``gate`` once per gate that was asked for,
``search`` once per task and strategy of a budget search (``--budgets=search:LO..HI``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, NoReturn, TypeVar

import pytest

from pytest_budgetbench.engine.session import SESSION_KEY
from pytest_budgetbench.errors import (
    BudgetBenchError,
    BudgetExceeded,
    EmbeddedServerError,
    StrategyAborted,
)
from pytest_budgetbench.pytest_face import xdist as distributed
from pytest_budgetbench.records.rows import Status
from pytest_budgetbench.redact import redact
from pytest_budgetbench.sweep.workers import worker_id

T = TypeVar("T")

if TYPE_CHECKING:
    from pytest_budgetbench.engine.runner import CellResult
    from pytest_budgetbench.engine.session import BudgetBenchSession
    from pytest_budgetbench.records.safe_budgets import SafeBudgetRecord
    from pytest_budgetbench.reports.gates.verdicts import GateSpec, GateVerdict

pytestmark = [pytest.mark.budgetbench]
VERDICT_PROPERTY = "budgetbench_gate"
"""The user property under which a gate item's report carries its verdict (JSON)."""
SAFE_BUDGET_PROPERTY = "budgetbench_safe_budget"
"""The user property under which a search item's report carries its record (JSON)."""
NO_SWEEP = ("no sweep runs: pass --budgets=N,N (or set budgetbench_budgets in the ini) to "
            "run this test over the sweep's cells")


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
    from pytest_budgetbench.pytest_face.progress import cell_properties

    # The progress line reads these off the report, in this process or through xdist.
    request.node.user_properties.extend(cell_properties(budget_cell.cell, budget_cell.row))
    settings = request.config.stash[SESSION_KEY].settings
    assert_within_budget(budget_cell, gated=settings.max_violation_rate is not None)


def gate(budget_gate: GateVerdict) -> None:
    """One gate over the cells of one strategy@budget; fails with its one-line reason."""
    if not budget_gate.passed:
        pytest.fail(budget_gate.message or budget_gate.spec.gate_id, pytrace=False)


def search(budget_search: SafeBudgetRecord) -> None:
    """One task and strategy's smallest safe budget; fails when it is above
    --budgetbench-max-safe-budget (or none is found under it)."""
    if budget_search["gate"]:
        pytest.fail(budget_search["gate"], pytrace=False)


# -- helpers of the budget_cell, budget_gate and budget_search fixtures ----------------
def stop_without_a_server(request: pytest.FixtureRequest, exc: EmbeddedServerError) -> NoReturn:
    """The embedded server, started on the first cache miss, did not start: no later cell
    could get a reply either, so the run stops with the reason, as a failed start before
    the first cell does (the cell keeps its error row, which is never graded). An xdist
    worker's exit is not shown, but its ``shouldstop`` is: the controller stops every
    worker with it, and prints it."""
    reason = redact(f"budgetbench: {exc}")
    if distributed.is_worker(request.config):
        request.session.shouldstop = reason
    pytest.exit(reason, returncode=pytest.ExitCode.USAGE_ERROR)


def benchmark_timer(request: pytest.FixtureRequest) -> ModelCallTimer | None:
    """Time the model call exactly once through pytest-benchmark, when it is active."""
    config = request.config
    # pytest-benchmark switches itself off under xdist (it reads PYTEST_XDIST_WORKER).
    if not config.pluginmanager.hasplugin("benchmark") or worker_id():
        return None
    if config.stash[SESSION_KEY].settings.parallel_cells > 1:
        return None  # cells run ahead in threads; there is no call left to time
    if getattr(config.option, "benchmark_disable", False) or distributed.is_distributed(config):
        return None

    return ModelCallTimer(request)


class ModelCallTimer:
    """Times the one model call of a cell, or an agent episode as a whole (its calls, tool
    executions and strategy work); a cell that makes no call (a violation, a resumed
    cell) never asks for the benchmark fixture, which pytest-benchmark would warn about."""

    def __init__(self, request: pytest.FixtureRequest) -> None:
        self.request = request
        self.timed = False

    def __call__(self, work: Callable[[], T]) -> T:
        benchmark = self.request.getfixturevalue("benchmark")
        cell = self.request.param
        # One table per task and strategy@budget, not one ~200-column table of all cells.
        benchmark.group = f"{cell.task} {cell.strategy_label}@{cell.budget}"
        from pytest_budgetbench.model.chat import Completion

        outcome = benchmark.pedantic(work, rounds=1, iterations=1)
        if isinstance(outcome, Completion):
            benchmark.extra_info["output_tokens"] = outcome.completion_tokens
        self.timed = True
        return outcome


def parametrize_sweep(metafunc: pytest.Metafunc, session: BudgetBenchSession) -> None:
    """Parametrize a test over the cells (``budget_cell``) and the gates (``budget_gate``)
    it asks for; a bad sweep is a usage error."""
    try:
        if "budget_cell" in metafunc.fixturenames:
            cells = session.cells
            metafunc.parametrize(
                "budget_cell", cells, ids=[c.cell_id for c in cells], indirect=True
            )
        if "budget_gate" in metafunc.fixturenames:
            gates = session.gates
            metafunc.parametrize(
                "budget_gate", gates, ids=[g.gate_id for g in gates], indirect=True
            )
        if "budget_search" in metafunc.fixturenames:
            searches = session.searches
            metafunc.parametrize(
                "budget_search", searches, ids=[s.search_id for s in searches], indirect=True
            )
    except BudgetBenchError as exc:
        raise pytest.UsageError(redact(f"budgetbench: {exc}")) from None


def run_budget_cell(request: pytest.FixtureRequest) -> CellResult:
    """What the ``budget_cell`` fixture gives: the cell ``request.param``, run (skipped
    without a sweep or when the session skips it)."""
    session = request.config.stash.get(SESSION_KEY, None)
    if session is None:
        pytest.skip(NO_SWEEP)
    cell = request.param
    reason = session.skip_reason(cell)
    if reason:
        pytest.skip(reason)
    timer = benchmark_timer(request)
    try:
        result = session.run_cell(cell, timer)
    except StrategyAborted as exc:
        # Its row is written; the run stops as a Ctrl-C would, summary and report included.
        pytest.exit(redact(str(exc)), returncode=pytest.ExitCode.INTERRUPTED)
    except EmbeddedServerError as exc:
        stop_without_a_server(request, exc)
    if timer is not None and timer.timed:
        request.getfixturevalue("benchmark").extra_info.update(
            quality=result.quality, counted_tokens=result.row.counted_tokens
        )
    return result


def run_budget_search(request: pytest.FixtureRequest) -> SafeBudgetRecord:
    """What the ``budget_search`` fixture gives: the search ``request.param``, run and
    recorded (skipped without a sweep, or when its task cannot run on this endpoint)."""
    session = request.config.stash.get(SESSION_KEY, None)
    if session is None:
        pytest.skip(NO_SWEEP)
    spec = request.param
    reason = session.task_skip_reason(spec.task)
    if reason:
        pytest.skip(reason)
    try:
        record = session.run_search(spec)
    except StrategyAborted as exc:
        pytest.exit(redact(str(exc)), returncode=pytest.ExitCode.INTERRUPTED)
    except EmbeddedServerError as exc:
        stop_without_a_server(request, exc)
    # --junitxml shows it as a property: a CI job reads the answer off its test case.
    request.node.user_properties.append((SAFE_BUDGET_PROPERTY, json.dumps(record)))
    return record


def gate_verdicts(report: pytest.TestReport) -> list[GateVerdict]:
    """The verdicts a gate item's report carries (under :data:`VERDICT_PROPERTY`)."""
    from pytest_budgetbench.reports.gates.verdicts import GateVerdict

    return [GateVerdict.from_public(json.loads(str(value)))
            for name, value in report.user_properties if name == VERDICT_PROPERTY]


def judge_gate(request: pytest.FixtureRequest, session: BudgetBenchSession, spec: GateSpec,
               elsewhere: set[str]) -> GateVerdict:
    """What the ``budget_gate`` fixture gives: the verdict of ``spec``, also kept on the
    item's report."""
    try:
        verdict = session.judge(spec, elsewhere)
    except EmbeddedServerError as exc:
        stop_without_a_server(request, exc)
    # The controller's summary reads it, and --junitxml shows it as a property.
    request.node.user_properties.append((VERDICT_PROPERTY, json.dumps(verdict.public())))
    return verdict
