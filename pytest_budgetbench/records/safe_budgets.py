"""safe_budgets.jsonl: what a budget search (``--budgets=search:LO..HI``) found, one record
per task and strategy, written and read here.

The search item of each task and strategy appends its record when it ends (xdist workers
share the file, as they share cells.jsonl); the controller reads them back for the
terminal table and the plot. A resumed search appends again, and the last record of a task
and strategy is its answer. The probes' cells are ordinary rows of cells.jsonl. A record::

    {"task": "memory", "strategy": "truncation", "lo": 512, "hi": 4096, "step": 64,
     "min_retention": 0.9, "max_violation_rate": 0.05, "safe_budget": 2560,
     "below": 2496, "scanned": null, "max_safe_budget": 2048,
     "gate": "memory: truncation: safe budget 2560 is above the maximum 2048 ...",
     "probes": [{"budget": 4096, "n_ok": 10, "n_violation": 0, "n_error": 0,
                 "retention": 1.0, "n_retention": 8, "answer_kept": null,
                 "reasons": []}, ...]}

``below`` is the grid budget under the safe budget (None when the safe budget is LO, or
none was found: then the table explains HI); ``scanned`` says why the search probed every
budget from HI down (None: binary search); ``gate`` is the failure of
``--budgetbench-max-safe-budget`` (None: it passed or was not asked for).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import NotRequired, TypedDict, cast

from pytest_budgetbench.records import jsonl

SAFE_BUDGETS_FILE = "safe_budgets.jsonl"


class ProbeRecord(TypedDict):
    """One probe: every item of the task at one budget, and how the floors judged it."""

    budget: int
    n_ok: int
    n_violation: int
    n_error: int
    retention: float | None
    """Mean evidence retention over the admitted items that declare evidence (each item's
    repeats averaged first), as the retention floor gate computes it."""
    n_retention: int
    answer_kept: float | None
    """Mean answer kept over the admitted items whose evidence holds their answer (each
    item's repeats averaged first), as the answer-kept floor gate computes it."""
    n_answer_kept: NotRequired[int]
    reasons: list[str]
    """Why the floors fail here (empty: they hold)."""


class SafeBudgetRecord(TypedDict):
    """One task and strategy's search."""

    task: str
    strategy: str
    lo: int
    hi: int
    step: int
    min_retention: float | None
    max_violation_rate: float | None
    min_answer_kept: NotRequired[float | None]
    safe_budget: int | None
    below: int | None
    scanned: str | None
    max_safe_budget: int | None
    gate: str | None
    probes: list[ProbeRecord]


def append_record(path: Path, record: SafeBudgetRecord) -> None:
    """Append one search's record (whole, under the file's lock)."""
    jsonl.append_jsonl(path, record)


def read_records(path: Path) -> list[SafeBudgetRecord]:
    """The last record of each task and strategy, in the order they were first written
    (none when the file is missing); a line that is not a search's record is skipped."""
    found: dict[tuple[str, str], SafeBudgetRecord] = {}
    for record in _records(path):
        found[(record["task"], record["strategy"])] = record
    return list(found.values())


def _records(path: Path) -> Iterator[SafeBudgetRecord]:
    for record in jsonl.read_jsonl(path):
        if not (isinstance(record.get("task"), str) and isinstance(record.get("strategy"), str)
                and isinstance(record.get("probes"), list)):
            continue
        yield cast(SafeBudgetRecord, record)
