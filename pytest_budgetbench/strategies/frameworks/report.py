"""The counter error of policies that trim by a count of their own, as a report extension.

A framework's policy trims the history to a token target that it counts with its own
counter (LangChain's ``count_tokens_approximately``, inspect_ai's, LlamaIndex's tiktoken
encoding ...), and records that count of the prompt it built on the row
(``estimated_tokens``, :meth:`~._policy.FrameworkPolicy.record_estimate`). The runner counts
the same prompt exactly (``counted_tokens``). Per task x strategy x budget, the table gives
the error ``counted - estimated`` (positive: the framework counted too few, so its prompt
is larger than it believes) as its median, 95th percentile and maximum, the share of cells
it undercounted, and of the cells over budget, how many its counter let through: violations
whose estimate fitted the budget, which an exact counter would have trimmed.

Any strategy that records an estimate is in the table; one that records none is not.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.records.rows import Status
from pytest_budgetbench.reports.extensions import ExtraTable
from pytest_budgetbench.reports.render import Column, col, integer, num, percent
from pytest_budgetbench.reports.summary import percentile

if TYPE_CHECKING:
    import pandas as pd

    from pytest_budgetbench.reports.plots import Plot

TABLE = "counter_error"
COLUMNS: tuple[str, ...] = (
    "task", "strategy", "budget", "cells", "error_median", "error_p95", "error_max",
    "undercounted", "violations", "violations_caused",
)
VIEW: tuple[Column, ...] = (
    col("task", "task"),
    col("strategy", "strategy"),
    col("budget", "budget", integer),
    col("cells", "cells", integer),
    col("error median", "error_median", num(1)),
    col("error p95", "error_p95", num(1)),
    col("error max", "error_max", integer),
    col("undercounted", "undercounted", percent),
    col("violations", "violations", integer),
    col("caused by its counter", "violations_caused", integer),
)


def error_table(rows: pd.DataFrame) -> pd.DataFrame:
    """The counter error per task x strategy x budget, over the cells (violations
    included) whose row records both counts; empty when none does."""
    import pandas as pd

    groups: dict[tuple[str, str, int], list[tuple[float, float, int, str]]] = defaultdict(list)
    if "estimated_tokens" in rows:
        known = rows[rows["estimated_tokens"].notna() & rows["counted_tokens"].notna()]
        for task, strategy, budget, estimated, counted, status in zip(
                known["task"], known["strategy"], known["budget"], known["estimated_tokens"],
                known["counted_tokens"], known["status"], strict=True):
            groups[(str(task), str(strategy), int(budget))].append(
                (float(estimated), float(counted), int(budget), str(status)))
    records = [_record(key, cells) for key, cells in sorted(groups.items())]
    return pd.DataFrame.from_records(records, columns=list(COLUMNS))


def _record(key: tuple[str, str, int], cells: list[tuple[float, float, int, str]]
            ) -> dict[str, Any]:
    errors = [counted - estimated for estimated, counted, _budget, _status in cells]
    violations = [(estimated, budget) for estimated, _counted, budget, status in cells
                  if status == Status.VIOLATION]
    task, strategy, budget = key
    return {
        "task": task, "strategy": strategy, "budget": budget, "cells": len(cells),
        "error_median": statistics.median(errors),
        "error_p95": percentile(errors, 0.95),
        "error_max": max(errors),
        "undercounted": sum(e > 0 for e in errors) / len(errors),
        "violations": len(violations),
        "violations_caused": sum(estimated <= budget for estimated, budget in violations),
    }


class CounterErrorReport:
    """The report extension: the counter-error table."""

    name = "counter_error"
    row_fields = ("estimated_tokens",)

    def tables(self, rows: pd.DataFrame) -> list[ExtraTable]:
        return [ExtraTable(
            TABLE, "Counter error: the policy's own count against the exact count",
            "Error = exact count - the policy's own count of the prompt it built (positive: "
            "it counted too few). Over the cells whose row records both, violations "
            "included. 'Caused by its counter': violations whose own count fitted the "
            "budget, which trimming by the exact count would have avoided.",
            error_table(rows), VIEW)]

    def plots(self, summary: pd.DataFrame, out_dir: Path) -> list[Plot]:
        return []


EXTENSION = CounterErrorReport()
