"""Gate items as the sweep runs them: a gate judges one strategy@budget over the run's rows.

A gate runs after the cells it judges, so its verdict reads their rows in the computed
report. Selected alone (``--lf``, ``-k``), it runs the cells this process has not run
yet itself, so it never judges part of the data; cells that other xdist workers run are
waited for in the records, and a gate whose cells never recorded a row says so.

The session is the run object (:class:`~pytest_budgetbench.engine.session.
BudgetBenchSession`); this module reads it through :class:`GateSession`, what a gate needs.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from pytest_budgetbench.errors import EmbeddedServerError
from pytest_budgetbench.reports.gates.verdicts import GateSpec, GateVerdict

if TYPE_CHECKING:
    from pytest_budgetbench.records.store import RunStore
    from pytest_budgetbench.reports import Report
    from pytest_budgetbench.settings.config import Settings
    from pytest_budgetbench.sweep.cells import Cell


class GateSession(Protocol):
    """What judging a gate reads of the session, and the cells it runs through it."""

    settings: Settings
    store: RunStore
    errored: set[str]
    """Cells that ended in an error row this process: a gate does not run them again."""

    @property
    def cells(self) -> list[Cell]: ...

    def skip_reason(self, cell: Cell) -> str | None: ...

    def run_cell(self, cell: Cell) -> object: ...

    def computed_report(self) -> Report: ...


def judge(session: GateSession, gate: GateSpec, running_elsewhere: set[str]) -> GateVerdict:
    """A gate's verdict over the session's computed report.

    Its cells are every cell of its strategy@budget: those this process has not run
    yet run now (a gate selected alone, e.g. by ``--lf``, judges complete data), and
    those ``running_elsewhere`` (other xdist workers) are waited for in the records.
    """
    settings = session.settings
    cells = [c for c in session.cells if c.strategy_label == gate.strategy
             and c.budget == gate.budget and not session.skip_reason(c)]
    for cell in cells:
        if cell.cell_id not in running_elsewhere and cell.cell_id not in session.errored:
            try:
                session.run_cell(cell)
            except EmbeddedServerError:
                raise  # no cell can get a reply: the run stops (see the plugin)
            except Exception:  # its error row is what the gate counts
                continue
    waiting = await_rows(session.store, {c.cell_id for c in cells} & running_elsewhere,
                         stall_s=settings.timeout * settings.retries + 60.0)
    from pytest_budgetbench import reports

    verdict = reports.gate_verdict(
        session.computed_report(), gate,
        max_rate=settings.max_violation_rate, max_regression=settings.max_regression,
        regression_test=settings.regression_test,
        baseline=Path(settings.baseline) if settings.baseline else None,
        min_retention=settings.retention_floor(gate.strategy, gate.budget, reference=False),
        min_answer_kept=settings.answer_kept_floor(gate.strategy, gate.budget, reference=False),
    )
    if waiting:
        stalled = f"{len(waiting)} of its cells never recorded a row (a worker stopped?)"
        verdict = replace(verdict, reasons=(*verdict.reasons, stalled) if verdict.reasons
                          else (f"{gate.gate_id}: {stalled}",))
    return verdict


def await_rows(store: RunStore, cell_ids: set[str], *, stall_s: float) -> set[str]:
    """Wait until other processes recorded a row for each cell; give up once the records
    stop growing for longer than ``stall_s`` (what one cell may take). Returns the ids
    still missing."""
    last_size, last_change = -1, time.monotonic()
    while True:
        missing = cell_ids - {row.get("cell_id") for row in store.rows()}
        if not missing:
            return set()
        size = store.cells_path.stat().st_size if store.cells_path.exists() else 0
        if size != last_size:
            last_size, last_change = size, time.monotonic()
        elif time.monotonic() - last_change > stall_s:
            return missing
        time.sleep(0.2)
