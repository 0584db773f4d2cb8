"""A budget search at run time (``--budgets=search:LO..HI``): each task and strategy's
smallest safe budget, probed through the session's cells.

A probe at budget ``b`` runs every item of the task (each repeat) under the strategy at
``b`` as ordinary cells (:meth:`~pytest_budgetbench.engine.session.BudgetBenchSession.
run_cell`): counted by the run's counter, held to ``b``, their rows in cells.jsonl,
their counts from the count cache and, model-free, nothing sent. The floors judge the
rows (:mod:`~pytest_budgetbench.reports.gates.safe_budget`), the search decides the next
budget (:mod:`~pytest_budgetbench.sweep.search`), and the answer goes to
safe_budgets.jsonl (:mod:`~pytest_budgetbench.records.safe_budgets`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from pytest_budgetbench.errors import (
    ConfigError,
    EmbeddedServerError,
    RecordError,
    RunStopping,
    StrategyAborted,
)
from pytest_budgetbench.records.safe_budgets import SafeBudgetRecord
from pytest_budgetbench.reports.gates.safe_budget import (
    Floors,
    ProbeOutcome,
    judge_probe,
    max_safe_budget,
    safe_budget_record,
)
from pytest_budgetbench.sweep.cells import Cell, id_part
from pytest_budgetbench.sweep.search import find_safe_budget

if TYPE_CHECKING:
    from pytest_budgetbench.engine.catalog import Catalog
    from pytest_budgetbench.records.store import RunStore
    from pytest_budgetbench.settings.config import Settings


@dataclass(frozen=True)
class SearchSpec:
    """One search item: a task and a strategy."""

    task: str
    strategy: str
    """How the strategy was selected (a registered name or ``module:attr``)."""
    name: str
    """The strategy's own name, as rows carry it."""
    reference: bool = False

    @property
    def search_id(self) -> str:
        return f"{id_part(self.task)} {id_part(self.name)}"


class SearchSession(Protocol):
    """What a search reads of the session, and the cells it runs through it."""

    settings: Settings
    catalog: Catalog
    store: RunStore

    def run_cell(self, cell: Cell) -> Any: ...


def search_specs(task_names: list[str], strategies: Mapping[str, tuple[str, bool]]
                 ) -> list[SearchSpec]:
    """One search per task and strategy (``strategies``: spec -> (name, reference))."""
    return [SearchSpec(task, spec, name, reference) for task in task_names
            for spec, (name, reference) in strategies.items()]


def check_limits(settings: Settings, names: list[str]) -> None:
    """``--budgetbench-max-safe-budget`` names only strategies the search runs."""
    for key in sorted((settings.max_safe_budget or {}).keys() - {""} - set(names)):
        raise ConfigError(
            f"--budgetbench-max-safe-budget: {key!r} is not a strategy of this search (it "
            f"runs {', '.join(names)}); name one it runs")


def floors_of(settings: Settings) -> Floors:
    return Floors((settings.min_retention or {}).get(""), settings.max_violation_rate,
                  (settings.min_answer_kept or {}).get(""))


def run_search(session: SearchSession, spec: SearchSpec) -> SafeBudgetRecord:
    """Search ``spec``'s safe budget, record it in safe_budgets.jsonl and return it."""
    settings = session.settings
    assert settings.search is not None
    floors = floors_of(settings)
    items = session.catalog.items(spec.task)

    def probe(budget: int) -> ProbeOutcome:
        rows: list[Mapping[str, Any]] = []
        for index, item in enumerate(items):
            for repeat in range(settings.repeats):
                cell = Cell(spec.task, index, item.item_id, spec.strategy, budget, repeat,
                            spec.name)
                try:
                    rows.append(session.run_cell(cell).row)
                except (EmbeddedServerError, StrategyAborted, RunStopping, RecordError):
                    raise  # the run stops (see the plugin), or cannot record
                except Exception:  # its error row is written; the probe counts it
                    rows.append({"item_id": item.item_id, "status": "error"})
        return judge_probe(budget, rows, floors)

    trace = find_safe_budget(settings.search.grid, probe)
    limit = max_safe_budget(settings.max_safe_budget or {}, spec.name, spec.reference)
    record = safe_budget_record(spec.task, spec.name, settings.search, floors, trace, limit)
    session.store.write_safe_budget(record)
    return record
