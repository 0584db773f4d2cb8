"""cells.jsonl's row: the schema (:class:`CellRow`), its status and its field lists.

One typed class: the runner fills it, :class:`~pytest_budgetbench.records.store.RunStore`
writes it, and every reader takes its field names from here (:data:`ROW_FIELDS`), and
what a field is to a reader from the field itself: whether it is part of the cell's key
(:data:`CELL_KEY`), a number the report aggregates (:data:`MEASURES`), a string with few
distinct values in a run (:data:`CATEGORICAL`), and the short key the per-cell viewer's
page gives it (:data:`PAGE_KEYS`). No reader keeps a second list of the fields.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from typing import Any

SCHEMA_VERSION = 6
"""The on-disk shape of a cells.jsonl row. Bump it when a field is added, removed, renamed
or changes meaning, and keep :meth:`CellRow.from_record` reading the older versions."""


class Status(StrEnum):
    """How a cell ended. A StrEnum, so a status equals its text (``Status.OK == "ok"``)
    and is written to cells.jsonl as that text."""

    OK = "ok"
    """Admitted: within budget, sent and graded; in a model-free sweep
    (``--budgetbench-model=none``) within budget and not sent, its quality empty."""
    VIOLATION = "violation"
    """The post-strategy prompt counted more tokens than the budget; nothing was sent."""
    ERROR = "error"
    """The strategy, the model or the grader failed; also a cell that never finished."""


FINAL_STATUSES = frozenset({Status.OK, Status.VIOLATION})
"""A cell recorded with one of these is done: a resume keeps it; errors run again."""

_KEY = "key"
"""Metadata: the field is part of the cell's key (a resumed cell's rows share it)."""
_MEASURE = "measure"
"""Metadata: a number the report's tables aggregate (read as float64)."""
_CATEGORICAL = "categorical"
"""Metadata: a string with few distinct values in a run (a reader holds each once)."""
_PAGE = "page"
"""Metadata: the short key the per-cell viewer's page gives the field (a page holds tens
of thousands of rows); a field without one is not shown per row."""


def _about(*, key: bool = False, measure: bool = False, categorical: bool = False,
           page: str | None = None) -> dict[str, Any]:
    """A CellRow field's metadata: what a reader needs to know of it (see the module
    docstring)."""
    about: dict[str, Any] = {_KEY: key, _MEASURE: measure, _CATEGORICAL: categorical}
    if page is not None:
        about[_PAGE] = page
    return about


@dataclass(kw_only=True, slots=True)
class CellRow(Mapping[str, Any]):
    """One cells.jsonl row: the schema. The runner fills it, :class:`RunStore` writes it,
    reports and the synthetic generator read its field names (:data:`ROW_FIELDS`).

    A dataclass rather than a TypedDict, so that a misspelled field is an error where the
    row is built (at run time as well as under mypy) and the runner writes attributes that
    mypy checks. It is also a read-only mapping of field name to value, so a user's
    ``budget_cell.row["counted_tokens"]`` and ``row.get("quality")`` keep working.
    Slotted, so assigning a misspelled attribute raises instead of adding a field.
    """

    schema: int = SCHEMA_VERSION
    run_id: str = field(metadata=_about(categorical=True))
    cell_id: str = field(metadata=_about(page="id"))
    task: str = field(metadata=_about(key=True, categorical=True))
    item_id: str = field(metadata=_about(key=True, categorical=True))
    category: str | None = field(default=None, metadata=_about(categorical=True))
    strategy: str = field(metadata=_about(key=True, categorical=True))
    regime: str | None = field(default=None, metadata=_about(categorical=True))
    reference: bool = False
    budget: int = field(metadata=_about(key=True))
    repeat: int = field(default=0, metadata=_about(key=True))
    # a cell that never finishes errored
    status: Status = field(default=Status.ERROR, metadata=_about(categorical=True, page="s"))
    counted_tokens: int | None = field(default=None, metadata=_about(measure=True, page="t"))
    server_prompt_tokens: int | None = field(default=None, metadata=_about(page="st"))
    token_count_match: bool | None = None
    utilisation: float | None = field(default=None, metadata=_about(measure=True, page="u"))
    quality: float | None = field(default=None, metadata=_about(measure=True, page="q"))
    prediction: str | None = field(default=None, metadata=_about(page="y"))
    extracted: str | None = field(default=None, metadata=_about(page="x"))
    gold: Any = None  # the item's gold answer(s), as the task holds them (schema 2)
    strategy_s: float | None = field(default=None, metadata=_about(measure=True, page="ss"))
    # the original call's latency, also when served from cache
    model_s: float | None = field(default=None, metadata=_about(measure=True, page="ms"))
    # the reply came from the response cache (this cell sent nothing)
    cached: bool | None = field(default=None, metadata=_about(page="ca"))
    output_tokens: int | None = field(default=None, metadata=_about(measure=True, page="o"))
    aux_calls: list[dict[str, Any]] = field(default_factory=list)
    aux_input_tokens: int = field(default=0, metadata=_about(measure=True, page="ai"))
    aux_output_tokens: int = field(default=0, metadata=_about(measure=True, page="ao"))
    aux_s: float = field(default=0.0, metadata=_about(measure=True, page="as"))
    aux_failures: int = 0  # auxiliary replies the strategy could not use (not JSON, wrong keys)
    strategy_info: dict[str, Any] | None = None
    model: str | None = field(default=None, metadata=_about(categorical=True))
    endpoint: str | None = field(default=None, metadata=_about(categorical=True))
    server_flags: dict[str, Any] = field(default_factory=dict)
    tokenizer: str | None = field(default=None, metadata=_about(categorical=True))
    tokenizer_exact: bool | None = None
    prompt_sha256: str | None = field(default=None, metadata=_about(page="sha"))
    grader: str | None = field(default=None, metadata=_about(categorical=True, page="g"))
    error: str | None = field(default=None, metadata=_about(categorical=True, page="e"))
    seed: int | None = None
    # the xdist worker that ran the cell, or null
    worker: str | None = field(default=None, metadata=_about(categorical=True))
    time: float | None = None
    # An agent episode's cell (schema 3); null for a single-call cell. counted_tokens is
    # then its largest call's count, model_s and output_tokens its calls' sums.
    # model calls made, the one over budget included
    calls: int | None = field(default=None, metadata=_about(measure=True, page="nc"))
    # done | violation | max_calls | error
    ended: str | None = field(default=None, metadata=_about(page="en"))
    # counted prompt tokens per call
    call_tokens: list[int] | None = field(default=None, metadata=_about(page="ct"))
    max_call_tokens: int | None = field(default=None, metadata=_about(page="mx"))
    p95_call_tokens: int | None = field(default=None, metadata=_about(page="p95"))
    # counted prompt tokens of the calls sent
    sum_call_tokens: int | None = field(default=None, metadata=_about(measure=True, page="sm"))
    # 1-based index of the call over budget
    violated_call: int | None = field(default=None, metadata=_about(page="vc"))
    # every sent call's prompt and output tokens: its cost
    total_tokens: int | None = field(default=None, metadata=_about(measure=True, page="tt"))
    # share of prompt tokens the previous call's prefix held
    prefix_reuse: float | None = field(default=None, metadata=_about(measure=True, page="pr"))
    # Evidence retention (schema 4, issue 33): of the item's evidence spans, how many the
    # prompt as sent holds verbatim (an episode's: its last call's, of the spans its
    # trajectory had shown by then); all three null where the item declares no evidence.
    evidence_total: int | None = field(default=None, metadata=_about(page="et"))
    evidence_kept: int | None = field(default=None, metadata=_about(page="ek"))
    # evidence_kept / evidence_total, rounded to 4 places
    evidence_retention: float | None = field(
        default=None, metadata=_about(measure=True, page="er"))
    # How an agent episode ran (schema 5, issue 33): free-running | teacher-forced; null
    # for a single-call cell. A teacher-forced episode's quality is its exact step accuracy
    # (steps_exact / steps), its evidence fields are summed over its steps' prompts.
    episode_mode: str | None = field(default=None, metadata=_about(categorical=True, page="mo"))
    # reference steps the model was asked to predict (every step's prompt was counted)
    steps: int | None = field(default=None, metadata=_about(page="ns"))
    # of those, predicted exactly (the task's step checker), and with the right functions
    steps_exact: int | None = field(default=None, metadata=_about(page="sx"))
    steps_name: int | None = field(default=None, metadata=_about(page="sn"))
    # steps_name / steps: the name-only step accuracy, beside quality's exact one
    name_accuracy: float | None = field(default=None, metadata=_about(measure=True, page="na"))
    # The strategy's own count of the prompt it built (schema 6, issue 40): a framework
    # policy's counter (LangChain's count_tokens_approximately, inspect_ai's, ...), which it
    # trimmed to; counted_tokens - estimated_tokens is that counter's error. Of an episode,
    # the estimate of the call counted_tokens is for. Null for a strategy that keeps none.
    estimated_tokens: int | None = field(default=None, metadata=_about(measure=True, page="es"))
    # What rewriting keeps without an answering model (schema 6, issue 40): of an item whose
    # gold answer, normalised as its grader normalises, occurs in its evidence, whether the
    # prompt as sent holds it outside the question; null where it does not occur there.
    # A measure: the report reads it as 1/0 and averages it (engine.answers).
    answer_kept: bool | None = field(default=None, metadata=_about(measure=True, page="ak"))
    # Whether that answer occurs in the history only inside the evidence (no echo in an
    # assistant reply, no coincidence of a short answer elsewhere); null with answer_kept.
    answer_unique: bool | None = field(default=None, metadata=_about(measure=True, page="au"))

    # -- the mapping face (read-only) -------------------------------------------------------
    def __getitem__(self, name: str) -> Any:
        if name not in _FIELD_NAMES:
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self) -> Iterator[str]:
        return iter(ROW_FIELDS)

    def __len__(self) -> int:
        return len(ROW_FIELDS)

    # -- on disk ----------------------------------------------------------------------------
    def record(self) -> dict[str, Any]:
        """The row as the JSON object written to cells.jsonl (fields in schema order).

        Shallow, unlike ``dataclasses.asdict``: a strategy's ``strategy_info`` is written as
        it is, never deep-copied."""
        return dict(zip(ROW_FIELDS, _all_values(self), strict=True))

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> CellRow:
        """A row read back from cells.jsonl, of this schema version or an older one.

        Fields the record lacks take their defaults; keys this version does not know are
        dropped (the file keeps them, and the report loader reads them as columns).
        Raises ValueError naming the first missing required field.
        """
        missing = [name for name in _REQUIRED if name not in record]
        if missing:
            raise ValueError(
                f"cells.jsonl row {record.get('cell_id', '(no cell_id)')!r} lacks the "
                f"field '{missing[0]}' (schema {record.get('schema', '?')}); it was not "
                f"written by budgetbench, or the file is damaged"
            )
        values = {name: record[name] for name in ROW_FIELDS if name in record}
        if "status" in values:
            values["status"] = _status(values["status"], record)
        return cls(**values)


def _status(raw: Any, record: Mapping[str, Any]) -> Status:
    try:
        return Status(raw)
    except ValueError:
        raise ValueError(
            f"cells.jsonl row {record.get('cell_id', '(no cell_id)')!r} has the status "
            f"{raw!r}; a status is one of {', '.join(s.value for s in Status)}"
        ) from None


ROW_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(CellRow))
"""The field names of a row, in the order they are written (derived from CellRow)."""
CELL_KEY: tuple[str, ...] = tuple(f.name for f in fields(CellRow) if f.metadata.get(_KEY))
"""The fields that name a cell: (task, item_id, strategy, budget, repeat). A resumed cell's
rows share them, and its last row wins."""
MEASURES: tuple[str, ...] = tuple(f.name for f in fields(CellRow) if f.metadata.get(_MEASURE))
"""The numeric fields the report's tables aggregate, in schema order."""
CATEGORICAL: frozenset[str] = frozenset(
    f.name for f in fields(CellRow) if f.metadata.get(_CATEGORICAL))
"""String fields with few distinct values in a run (a task, a status, a model)."""
PAGE_KEYS: dict[str, str] = {f.name: f.metadata[_PAGE] for f in fields(CellRow)
                             if _PAGE in f.metadata}
"""Row field -> the short key the per-cell viewer's page gives it: the fields it shows."""

_FIELD_NAMES = frozenset(ROW_FIELDS)
_all_values = operator.attrgetter(*ROW_FIELDS)  # every field's value in one call
_REQUIRED: tuple[str, ...] = tuple(
    f.name for f in fields(CellRow) if f.default is MISSING and f.default_factory is MISSING
)


def last_row_per_cell(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell id: the last one, as a resumed run supersedes its errors."""
    return list({row.get("cell_id"): row for row in rows}.values())
