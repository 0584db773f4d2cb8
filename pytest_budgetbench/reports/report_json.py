"""report.json: the machine-readable report, and what a later run's gates read back from it.

Besides the tables it carries each cell's per-item mean quality, so a later run can be
compared with this one item by item (the regression gate's paired test).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.errors import BaselineError
from pytest_budgetbench.reports.gates.verdicts import violation_rate
from pytest_budgetbench.reports.tables import (
    ADMITTED,
    CELL,
    PAIRED_SHARES,
    VIOLATION,
    key_values,
)

if TYPE_CHECKING:
    import pandas as pd

SCHEMA = "budgetbench.report"
SCHEMA_VERSION = 1


def _clean(value: Any) -> Any:
    """JSON-safe scalars: numpy types to Python, NaN to null."""
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def records(table: pd.DataFrame) -> list[dict[str, Any]]:
    return [
        {str(k): _clean(v) for k, v in row.items()}
        for row in table.to_dict(orient="records")
    ]


def item_cells(items: pd.DataFrame) -> list[dict[str, Any]]:
    """Per cell, its items' ids, mean quality (null unless admitted and scored), each share
    of :data:`~.tables.PAIRED_SHARES` (evidence retention, answer kept: null unless admitted
    and having one) and status."""
    cells = []
    for key, group in items.groupby(list(CELL), sort=True, observed=True):
        task, strategy, budget = key_values(key)
        cells.append(
            {
                "task": task,
                "strategy": strategy,
                "budget": int(budget),
                "reference": bool(group["reference"].any()),
                "item_id": [str(i) for i in group["item_id"]],
                "quality": [_clean(q) for q in group["quality"]],
                **{field: [_clean(r) for r in group[field]]
                   for field in PAIRED_SHARES.values()},
                "status": [str(s) for s in group["status"]],
            }
        )
    return cells


def write_report_json(path: Path, document: Mapping[str, Any]) -> None:
    from pytest_budgetbench.redact import redact_obj

    body = redact_obj({"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **document})
    path.write_text(dumps_indented(body) + "\n", encoding="utf-8")


def dumps_indented(value: Any) -> str:
    """``json.dumps(value, indent=1, ensure_ascii=False, allow_nan=False)``, byte for byte.

    ``indent`` makes ``json`` use its pure-Python encoder, which takes seconds for the
    million entries of a large report's item lists and holds every fragment of the text
    before joining them. Here each list or dict of scalars is encoded by the C encoder in
    one call, its separator carrying the newline and indent. allow_nan=False: a NaN that
    escaped _clean would make a file strict parsers reject.
    """
    parts: list[str] = []
    _encode(value, 0, parts)
    return "".join(parts)


def _encode(value: Any, level: int, parts: list[str]) -> None:
    if isinstance(value, dict):
        pairs: list[tuple[str, Any]] = [(_key_text(key), item) for key, item in value.items()]
        items = [item for _, item in pairs]
        brackets = "{}"
    elif isinstance(value, list | tuple):
        items, brackets = list(value), "[]"
    else:
        parts.append(json.dumps(value, ensure_ascii=False, allow_nan=False))
        return
    if not items:
        parts.append(brackets)
        return
    inner = "\n" + " " * (level + 1)
    if all(_is_scalar(item) for item in items):
        # The C encoder writes "[a,<inner>b]": add the first newline and the last.
        compact = json.dumps(value if brackets == "{}" else items, ensure_ascii=False,
                             allow_nan=False, separators=("," + inner, ": "))
        parts.extend((compact[0], inner, compact[1:-1], "\n", " " * level, compact[-1]))
        return
    parts.append(brackets[0])
    for index, item in enumerate(items):
        parts.append(inner if index == 0 else "," + inner)
        if brackets == "{}":
            parts.extend((json.dumps(pairs[index][0], ensure_ascii=False), ": "))
        _encode(item, level + 1, parts)
    parts.extend(("\n", " " * level, brackets[1]))


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | int | float)


def _key_text(key: Any) -> str:
    """A dict key as json writes it: str as it is, other scalars as their JSON text."""
    if isinstance(key, str):
        return key
    if key is None or isinstance(key, bool | int | float):
        text: str = json.dumps(key, allow_nan=False)
        return text
    raise TypeError(f"keys must be str, int, float, bool or None, not {type(key).__name__}")


@dataclass(frozen=True)
class CellRecord:
    """One strategy@budget cell of a task as a report recorded it."""

    quality: dict[str, float]  # item_id -> mean quality, admitted and scored items only
    n_ok: int
    n_violation: int
    reference: bool
    retention: dict[str, float] = field(default_factory=dict)
    """item_id -> mean evidence retention, admitted items that declare evidence only (empty
    for a report written before retention was recorded)."""
    answer_kept: dict[str, float] = field(default_factory=dict)
    """item_id -> the share of its admitted repeats that kept its answer, items whose
    evidence holds it only (empty for a report written before answer_kept was recorded)."""

    @property
    def violation_rate(self) -> float:
        return violation_rate(self.n_violation, self.n_ok)


def read_report_json(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise BaselineError(f"cannot read baseline report {path}: {exc}") from exc
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        raise BaselineError(f"{path} is not a budgetbench report.json")
    if document.get("schema_version") != SCHEMA_VERSION:
        raise BaselineError(
            f"{path} has report schema version {document.get('schema_version')!r}; "
            f"this version reads {SCHEMA_VERSION}"
        )
    return document


def cell_records(document: Mapping[str, Any]) -> dict[tuple[str, str, int], CellRecord]:
    """(task, strategy, budget) -> the cell's items and counts, from a report document."""
    counts = {
        (str(r["task"]), str(r["strategy"]), int(r["budget"])): r
        for r in document.get("summary", [])
    }
    cells: dict[tuple[str, str, int], CellRecord] = {}
    for cell in document.get("items", []):
        key = (str(cell["task"]), str(cell["strategy"]), int(cell["budget"]))
        quality = {
            str(item): float(q)
            for item, q, status in zip(cell["item_id"], cell["quality"], cell["status"],
                                       strict=True)
            if q is not None and status == ADMITTED
        }
        summary = counts.get(key, {})
        n_violation = summary.get("n_violation")
        if n_violation is None:
            n_violation = sum(1 for s in cell["status"] if s == VIOLATION)
        n_ok = summary.get("n_ok")
        if n_ok is None:
            n_ok = sum(1 for s in cell["status"] if s == ADMITTED)
        cells[key] = CellRecord(quality, int(n_ok), int(n_violation), bool(cell["reference"]),
                                _admitted(cell, "evidence_retention"),
                                _admitted(cell, "answer_kept"))
    return cells


def _admitted(cell: Mapping[str, Any], field: str) -> dict[str, float]:
    """item_id -> the cell's ``field`` list's value, admitted items with one only (none
    where the report has no such list: written before the field was)."""
    values = cell.get(field) or [None] * len(cell["item_id"])
    return {str(item): float(value)
            for item, value, status in zip(cell["item_id"], values, cell["status"], strict=True)
            if value is not None and status == ADMITTED}
