"""The per-cell summary statistics, computed in one place: the report's summary and category
tables (:func:`.tables.summary_table`) and the terminal's end-of-sweep table (with or
without a report, with or without pandas) all take them from :func:`summarise`.

What each statistic covers:

- counts: ``n_cells`` rows; ``n_ok``, ``n_violation``, ``n_error`` of them by status;
  :attr:`CellSummary.violation_rate` is violations / (admitted + violations).
- quality: over the cell's items, an item's quality the mean of its scored repeats (only
  admitted rows are scored), so an item counts once however often it ran. ``n_items``,
  ``n_admitted`` (an item with an admitted repeat) and ``n_scored`` count items. The
  interval is :mod:`.stats`' seeded percentile bootstrap over the item means in item id
  order, and Wilson's for a 0/1 grader; both need numpy, and are None without it (the core
  install).
- usage, over rows (every repeat is a real prompt): ``tokens_mean``, ``model_s_p50``,
  ``evidence_retention_mean``, ``answer_kept_mean`` and ``name_accuracy_mean`` over admitted
  rows, and ``answer_kept_unique_mean`` over those whose ``answer_unique`` is true; an episode's
  ``calls_mean`` and ``total_tokens_mean`` over admitted and violating rows (a violating
  episode made its earlier calls). A missing value is left out.

Means are ``math.fsum`` means (correctly rounded: the same in any row order), the median
:func:`statistics.median`. The input is columns (a sequence per field, as
:data:`FIELDS`), so the report passes its DataFrame's columns without a dict per row and
the terminal its rows' (:func:`row_columns`). Pure Python: no pandas, numpy optional.
"""

from __future__ import annotations

import importlib.util
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from itertools import compress
from typing import Any, TypeVar

from pytest_budgetbench.records.rows import Status
from pytest_budgetbench.reports.gates.verdicts import violation_rate

CELL: tuple[str, ...] = ("task", "strategy", "budget")
"""The keys of a cell; the category table adds ``category``."""

ADMITTED_MEASURES: dict[str, str] = {
    "tokens_mean": "counted_tokens",
    "evidence_retention_mean": "evidence_retention",
    "answer_kept_mean": "answer_kept",
    "name_accuracy_mean": "name_accuracy",
}
"""Statistic -> the row field it is the mean of, over admitted rows."""
RAN_MEASURES: dict[str, str] = {
    "calls_mean": "calls",
    "total_tokens_mean": "total_tokens",
}
"""Statistic -> the row field it is the mean of, over admitted and violating rows."""
FIELDS: tuple[str, ...] = ("item_id", "repeat", "status", "reference", "quality", "model_s",
                           *ADMITTED_MEASURES.values(), *RAN_MEASURES.values(), "answer_unique")
"""The row fields :func:`summarise` reads, besides the keys."""
FLAGS: tuple[str, ...] = ("answer_kept", "answer_unique")
"""Row fields that are true or false: the statistics read them as 1 and 0."""


@dataclass(frozen=True)
class CellSummary:
    """One cell's statistics; each field but ``key`` is the report's column of its name."""

    key: Mapping[str, Any]
    """The cell's keys and their values: task, strategy, budget (and category)."""
    reference: bool
    n_items: int
    n_admitted: int
    n_scored: int
    quality_mean: float | None
    quality_lo: float | None
    quality_hi: float | None
    binary: bool | None
    """Every item's quality is 0 or 1 (so Wilson's interval applies); None without numpy."""
    wilson_lo: float | None
    wilson_hi: float | None
    n_cells: int
    n_ok: int
    n_violation: int
    n_error: int
    tokens_mean: float | None
    model_s_p50: float | None
    calls_mean: float | None
    """Model calls per agent episode (None for single-call tasks)."""
    total_tokens_mean: float | None
    """Prompt and output tokens an agent episode spent, over its calls."""
    evidence_retention_mean: float | None
    """The share of their items' evidence the prompts as sent kept verbatim (None where no
    item declares evidence)."""
    answer_kept_mean: float | None
    """The share of prompts that kept their item's gold answer outside the question, over
    the items whose evidence holds it (engine.answers; None where none does)."""
    answer_kept_unique_mean: float | None
    """The same over the items whose answer the history holds only in the evidence (no
    echo, no coincidence): there a kept answer is kept evidence."""
    name_accuracy_mean: float | None
    """A teacher-forced episode's name-only step accuracy (its quality is the exact one);
    None where no cell is teacher-forced."""

    @property
    def task(self) -> str:
        return str(self.key["task"])

    @property
    def strategy(self) -> str:
        return str(self.key["strategy"])

    @property
    def budget(self) -> int:
        return int(self.key["budget"])

    @property
    def violation_rate(self) -> float:
        return violation_rate(self.n_violation, self.n_ok)

    def record(self) -> dict[str, Any]:
        """The cell as a row of the report's table: keys first, None as NaN."""
        values = {name: getattr(self, name) for name in COLUMNS}
        return {**self.key, **{name: math.nan if value is None else value
                               for name, value in values.items()},
                "violation_rate": self.violation_rate}

    @classmethod
    def from_record(cls, record: Mapping[Hashable, Any], keys: Sequence[str] = CELL
                    ) -> CellSummary:
        """The cell of a row of the report's table (:meth:`record`), NaN as None."""
        values = {name: _present(record[name]) for name in COLUMNS}
        for name in _COUNTS:
            values[name] = int(values[name] or 0)
        values["reference"] = bool(values["reference"])
        return cls(key={name: record[name] for name in keys}, **values)


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(CellSummary) if f.name != "key")
"""The report's summary columns computed here (and ``violation_rate``, from the counts)."""
_RAN = frozenset({Status.OK, Status.VIOLATION})
_COUNTS = ("n_items", "n_admitted", "n_scored", "n_cells", "n_ok", "n_violation", "n_error")


def numpy_importable() -> bool:
    """Whether the quality intervals can be computed (the ``reports`` extra's numpy)."""
    return importlib.util.find_spec("numpy") is not None


def summarise(columns: Mapping[str, Sequence[Any]], keys: Sequence[str] = CELL, *,
              resamples: int, seed: int) -> list[CellSummary]:
    """The statistics of each cell of the rows, sorted by key.

    ``columns`` maps the ``keys`` and :data:`FIELDS` to a sequence each, one value per row
    (a missing value None or NaN), one row per cell and repeat; a column is read once, when
    its statistic is computed. ``quality`` is read as given: it belongs to admitted rows
    only (:func:`row_columns` and the report's reader drop it elsewhere). The intervals
    use ``resamples`` bootstrap resamples seeded by ``seed`` and the cell's key.
    """
    keys = list(keys)
    index: dict[tuple[Any, ...], int] = {}
    codes = [index.setdefault(key, len(index)) for key in zip(*(columns[k] for k in keys),
                                                             strict=True)]
    n = len(index)
    sizes = Counter(codes)
    statuses = columns["status"]
    by_status = Counter(zip(codes, statuses, strict=True))
    admitted = _positions(codes, [status == Status.OK for status in statuses], n)
    ran = _positions(codes, [status in _RAN for status in statuses], n)
    reference = [False] * n
    for code, flag in zip(codes, columns["reference"], strict=True):
        if flag:
            reference[code] = True
    usage: dict[str, list[float | None]] = {}
    for name, field in ADMITTED_MEASURES.items():
        usage[name] = [_mean(v) for v in _present_values(columns[field], admitted)]
    for name, field in RAN_MEASURES.items():
        usage[name] = [_mean(v) for v in _present_values(columns[field], ran)]
    unique_kept = [kept if unique == 1 else None
                   for kept, unique in zip(columns["answer_kept"], columns["answer_unique"],
                                           strict=True)]
    usage["answer_kept_unique_mean"] = [_mean(v) for v in _present_values(unique_kept, admitted)]
    model_s = [statistics.median(v) if v else None
               for v in _present_values(columns["model_s"], admitted)]
    items = _items(codes, columns, admitted)
    cells = sorted(index, key=index.__getitem__)  # by code
    intervals = _intervals(cells, items, resamples=resamples, seed=seed)
    summaries = []
    for code, cell in enumerate(cells):
        n_items, n_admitted, scores = items[code]
        summaries.append(CellSummary(
            key=dict(zip(keys, cell, strict=True)),
            reference=reference[code],
            n_items=n_items,
            n_admitted=n_admitted,
            n_scored=len(scores),
            quality_mean=_mean([score for _, score in scores]),
            **intervals[code],
            n_cells=sizes[code],
            n_ok=by_status[(code, Status.OK)],
            n_violation=by_status[(code, Status.VIOLATION)],
            n_error=by_status[(code, Status.ERROR)],
            tokens_mean=usage["tokens_mean"][code],
            model_s_p50=model_s[code],
            calls_mean=usage["calls_mean"][code],
            total_tokens_mean=usage["total_tokens_mean"][code],
            evidence_retention_mean=usage["evidence_retention_mean"][code],
            answer_kept_mean=usage["answer_kept_mean"][code],
            answer_kept_unique_mean=usage["answer_kept_unique_mean"][code],
            name_accuracy_mean=usage["name_accuracy_mean"][code],
        ))
    return sorted(summaries, key=lambda s: tuple(s.key.values()))


Items = tuple[int, int, list[tuple[str, float]]]
"""A cell's item count, admitted item count, and (item id, quality) of its scored items."""


def _items(codes: list[int], columns: Mapping[str, Sequence[Any]],
           admitted: list[list[int]]) -> list[Items]:
    """Each cell's items: a row is its item unless the run repeated items (rows are one per
    cell and repeat, so without a repeat above 0 each row is one item)."""
    item_ids = columns["item_id"]
    quality = columns["quality"]
    n = len(admitted)
    if not any(columns["repeat"]):
        sizes = Counter(codes)
        return [(sizes[code], len(rows),
                 [(item, score) for item, score in zip(map(item_ids.__getitem__, rows),
                                                       map(quality.__getitem__, rows),
                                                       strict=True)
                  if score == score and score is not None])
                for code, rows in enumerate(admitted)]
    merged: dict[tuple[int, str], tuple[list[bool], list[float]]] = {}
    ok = set().union(*admitted)
    for row, (code, item, score) in enumerate(zip(codes, item_ids, quality, strict=True)):
        flags, scores = merged.setdefault((code, item), ([False], []))
        if row in ok:
            flags[0] = True
        if score == score and score is not None:
            scores.append(score)
    cells: list[Items] = [(0, 0, []) for _ in range(n)]
    for (code, item), (flags, scores) in merged.items():
        n_items, n_admitted, scored_items = cells[code]
        if scores:
            scored_items.append((item, math.fsum(scores) / len(scores)))
        cells[code] = (n_items + 1, n_admitted + flags[0], scored_items)
    return cells


def _intervals(cells: list[tuple[Any, ...]], items: list[Items], *, resamples: int,
               seed: int) -> list[dict[str, Any]]:
    """Each cell's quality interval fields: the bootstraps of all cells at once (they run
    in parallel, :func:`.stats.bootstrap_cis`) and Wilson's; None without numpy."""
    none = {"quality_lo": None, "quality_hi": None, "binary": None, "wilson_lo": None,
            "wilson_hi": None}
    if not numpy_importable():
        return [none for _ in cells]
    from pytest_budgetbench.reports import stats

    samples = [[score for _, score in sorted(scored)] for _, _, scored in items]
    intervals = stats.bootstrap_cis(
        [(scores, stats.cell_rng(seed, "quality", *cell))
         for scores, cell in zip(samples, cells, strict=True)], resamples=resamples)
    fields = []
    for scores, (lo, hi) in zip(samples, intervals, strict=True):
        binary = stats.is_binary(scores)
        w_lo, w_hi = (stats.wilson_interval(int(math.fsum(scores)), len(scores)) if binary
                      else (None, None))
        fields.append({"quality_lo": _present(lo), "quality_hi": _present(hi),
                       "binary": binary, "wilson_lo": w_lo, "wilson_hi": w_hi})
    return fields


def _positions(codes: list[int], kept: list[bool], n: int) -> list[list[int]]:
    """Each cell's kept rows, as row positions."""
    positions: list[list[int]] = [[] for _ in range(n)]
    append = [cell.append for cell in positions]
    for row, code in compress(enumerate(codes), kept):
        append[code](row)
    return positions


def _present_values(values: Sequence[Any], positions: list[list[int]]) -> list[list[Any]]:
    """Each cell's present values (not None, not NaN) at its positions."""
    return [[value for value in map(values.__getitem__, rows)
             if value == value and value is not None] for rows in positions]


def _is_value(value: Any) -> bool:
    return value is not None and value == value  # NaN is missing


Number = TypeVar("Number", int, float)


def percentile(values: Sequence[Number], fraction: float) -> Number:
    """The nearest-rank percentile of ``values`` (non-empty): a value that occurred (p95 of
    20 values is the 19th smallest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def _mean(values: Sequence[float]) -> float | None:
    return math.fsum(values) / len(values) if values else None


def _present(value: Any) -> Any:
    """None for a missing value (None or NaN), else the value."""
    return value if _is_value(value) else None


# -- what a mean leaves out ----------------------------------------------------------------
def retention_notes(rows: Iterable[Mapping[Any, Any]]) -> list[str]:
    """One line per task and strategy@budget whose mean evidence retention leaves out items
    that declare evidence: how many, of how many, and why (over budget, errored, or
    admitted with none of it shown yet), so no item drops out of a mean without a word.
    An item declares evidence when any of its rows counted some (a violating prompt's row
    counts it too); the reports average over the admitted rows that have a retention."""
    seen = [(str(r["task"]), str(r["item_id"]), str(r["strategy"]), int(r["budget"]),
             str(r["status"]), _number(r.get("evidence_retention"))) for r in rows]
    declares = {(task, item) for task, item, *_rest, kept in seen if kept is not None}
    outcomes: dict[tuple[str, str, int], dict[str, set[str]]] = defaultdict(dict)
    for task, item, strategy, budget, status, kept in seen:
        if (task, item) in declares:
            why = "counted" if status == Status.OK and kept is not None else status
            outcomes[(task, strategy, budget)].setdefault(item, set()).add(why)
    notes = []
    for (task, strategy, budget), items in sorted(outcomes.items()):
        left: defaultdict[str, int] = defaultdict(int)
        for whys in items.values():
            if "counted" not in whys:  # a repeat that counted keeps the item in the mean
                left[next(w for w in _LEFT_OUT if w in whys)] += 1
        if left:
            reasons = ", ".join(f"{left[why]} {text}" for why, text in _LEFT_OUT.items()
                                if left[why])
            notes.append(f"task {task}: {strategy}@{budget}: evidence retention is the mean "
                         f"over {len(items) - sum(left.values())} of the {len(items)} items "
                         f"that declare evidence; left out: {reasons}")
    return notes


_LEFT_OUT: dict[str, str] = {
    Status.VIOLATION: "over budget (the prompt was not sent)",
    Status.ERROR: "errored (see cells.jsonl)",
    Status.OK: "admitted with none of their evidence shown yet",
}
"""Why an item that declares evidence is not in a cell's retention mean (every status a
row may have), in the order the line names them and a mixed item's repeats decide."""


# -- rows -----------------------------------------------------------------------------------
def row_columns(rows: Iterable[Mapping[str, Any]], keys: Sequence[str] = CELL
                ) -> dict[str, list[Any]]:
    """cells.jsonl rows (one per cell) as :func:`summarise`'s columns, typed as the report's
    reader types them: ids as text, the budget and repeat as integers, a missing status as
    an error, numbers as floats (:data:`FLAGS` as 1.0 and 0.0, anything else missing), and
    quality on admitted rows only."""
    columns: dict[str, list[Any]] = {name: [] for name in (*keys, *FIELDS)}
    numbers = [name for name in ("model_s", *ADMITTED_MEASURES.values(),
                                 *RAN_MEASURES.values()) if name not in FLAGS]
    for row in rows:
        status = str(row.get("status") or Status.ERROR)
        for name in keys:
            columns[name].append(int(row[name]) if name == "budget" else str(row[name]))
        columns["item_id"].append(str(row.get("item_id")))
        columns["repeat"].append(int(row.get("repeat") or 0))
        columns["status"].append(status)
        columns["reference"].append(row.get("reference") is True)
        columns["quality"].append(_number(row.get("quality")) if status == Status.OK else None)
        for name in numbers:
            columns[name].append(_number(row.get(name)))
        for name in FLAGS:
            flag = row.get(name)
            columns[name].append(float(flag) if isinstance(flag, bool) else None)
    return columns


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or value is None:
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if number == number else None
