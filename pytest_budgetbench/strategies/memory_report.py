"""Memory systems in the report, as a report extension: what building and reading each
system's memory cost, and how often its auxiliary replies could not be used.

A memory-system strategy (memgpt, mem0, amem, or a third party's following the same
convention) records ``strategy_info[NAME] = {"construction": {...}, "query": {...}}``,
each phase with ``aux_calls``, ``input_tokens``, ``output_tokens``, ``seconds`` and
``aux_failures`` (:class:`~pytest_budgetbench.strategies._memory_system.Cost`), and the
construction with ``reused``. ``seconds`` is the wall time of the phase in this run (short
when its replies came from the response cache); ``model_s`` the model's recorded time for
its calls (a cached reply keeps the latency it was first answered in): what building
costs. Construction is paid once per built memory, by the cell that built it (a memory is
shared by an item's budgets at or above the system's window, and by items whose messages
are identical, e.g. LoCoMo questions over one conversation), so its costs are averaged
over the cells with ``reused`` false; query-time costs are averaged over every cell. The
failure rate is the row's ``aux_failures`` over its auxiliary calls, both phases, summed
over the cells.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.reports.extensions import ExtraTable
from pytest_budgetbench.reports.render import Column, col, integer, num, percent

if TYPE_CHECKING:
    import pandas as pd

    from pytest_budgetbench.reports.plots import Plot

TABLE = "memory_costs"
PHASES = ("construction", "query")

COLUMNS: tuple[str, ...] = (
    "task", "strategy", "budget", "system", "cells", "built",
    "build_aux_calls", "build_tokens", "build_s", "build_model_s",
    "query_aux_calls", "query_tokens", "query_s",
    "aux_calls", "aux_failures", "failure_rate",
)
VIEW: tuple[Column, ...] = (
    col("task", "task"),
    col("strategy", "strategy"),
    col("budget", "budget", integer),
    col("cells", "cells", integer),
    col("memories built", "built", integer),
    col("build aux calls / memory", "build_aux_calls", num(1)),
    col("build tokens / memory", "build_tokens", num(0)),
    col("build s / memory", "build_s", num(1)),
    col("build model s / memory", "build_model_s", num(1)),
    col("query aux calls / cell", "query_aux_calls", num(2)),
    col("query tokens / cell", "query_tokens", num(0)),
    col("query s / cell", "query_s", num(2)),
    col("aux calls", "aux_calls", integer),
    col("aux failures", "aux_failures", integer),
    col("failure rate", "failure_rate", percent),
)


def phases_of(value: Any) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """``(system, construction, query)`` for each memory system a row's strategy_info notes."""
    if not isinstance(value, dict):
        return
    for system, info in value.items():
        if isinstance(info, dict) and all(isinstance(info.get(p), dict) for p in PHASES):
            yield str(system), info["construction"], info["query"]


@dataclass
class _Group:
    cells: int = 0
    built: list[dict[str, Any]] = field(default_factory=list)
    queries: list[dict[str, Any]] = field(default_factory=list)
    aux_calls: int = 0
    aux_failures: int = 0


def _count(calls: Any) -> int:
    """A row's auxiliary calls: the report loads them as a count, a raw row has the list."""
    if isinstance(calls, list):
        return len(calls)
    try:
        return int(calls) if calls == calls else 0  # NaN: a cell that made no call
    except (TypeError, ValueError):
        return 0


def _tokens(phase: dict[str, Any]) -> float:
    return float(phase.get("input_tokens", 0)) + float(phase.get("output_tokens", 0))


def _mean(phases: list[dict[str, Any]], value: Any) -> float | None:
    return sum(map(value, phases)) / len(phases) if phases else None


def cost_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Construction and query-time cost per task x strategy x budget (empty without
    memory-system rows)."""
    import pandas as pd

    groups: dict[tuple[str, str, int, str], _Group] = defaultdict(_Group)
    if "strategy_info" in rows:
        failures = rows["aux_failures"] if "aux_failures" in rows else [0] * len(rows)
        aux_calls = rows["aux_calls"] if "aux_calls" in rows else [None] * len(rows)
        for task, strategy, budget, info, failed, calls in zip(
                rows["task"], rows["strategy"], rows["budget"], rows["strategy_info"],
                failures, aux_calls, strict=True):
            for system, construction, query in phases_of(info):
                group = groups[(str(task), str(strategy), int(budget), system)]
                group.cells += 1
                if not construction.get("reused", False):
                    group.built.append(construction)
                group.queries.append(query)
                group.aux_calls += _count(calls)
                group.aux_failures += int(failed) if pd.notna(failed) else 0
    records = []
    for (task, strategy, budget, system), group in sorted(groups.items()):
        records.append({
            "task": task, "strategy": strategy, "budget": budget, "system": system,
            "cells": group.cells, "built": len(group.built),
            "build_aux_calls": _mean(group.built, lambda p: float(p.get("aux_calls", 0))),
            "build_tokens": _mean(group.built, _tokens),
            "build_s": _mean(group.built, lambda p: float(p.get("seconds", 0.0))),
            # Rows written before model_s was recorded do not count as 0 s.
            "build_model_s": _mean([p for p in group.built if "model_s" in p],
                                   lambda p: float(p["model_s"])),
            "query_aux_calls": _mean(group.queries, lambda p: float(p.get("aux_calls", 0))),
            "query_tokens": _mean(group.queries, _tokens),
            "query_s": _mean(group.queries, lambda p: float(p.get("seconds", 0.0))),
            "aux_calls": group.aux_calls, "aux_failures": group.aux_failures,
            "failure_rate": group.aux_failures / group.aux_calls if group.aux_calls else None,
        })
    return pd.DataFrame.from_records(records, columns=list(COLUMNS))


class MemorySystemsReport:
    """The report extension: the memory-cost table."""

    name = "memory_systems"
    row_fields = ("strategy_info", "aux_failures")

    def tables(self, rows: pd.DataFrame) -> list[ExtraTable]:
        return [ExtraTable(
            TABLE, "Memory systems: construction and query-time cost",
            "Construction is averaged over the memories built (a memory is reused by an "
            "item's budgets at or above the system's window and by items with the same "
            "history); query-time cost over every cell. Tokens are auxiliary input + output. "
            "The failure rate is auxiliary replies the system could not use (not JSON, wrong "
            "keys) over its auxiliary calls.",
            cost_table(rows), VIEW)]

    def plots(self, summary: pd.DataFrame, out_dir: Path) -> list[Plot]:
        return []


EXTENSION = MemorySystemsReport()
