"""Run records: one JSON row per cell, appended in one write as soon as the cell ends.

Layout of a run directory::

    <out>/<run_id>/cells.jsonl     one row per cell (see CellRow)
    <out>/<run_id>/prompts.jsonl   the post-strategy prompt per cell (--budgetbench-audit)
    <out>/<run_id>/episodes.jsonl  an agent episode's trajectory and calls, per episode cell
    <out>/<run_id>/run.json        the run's settings and definition, written by the controller
    <out>/<run_id>/run.lock        held (flock) by the controller while a session writes the run

Rows are appended with ``O_APPEND`` under an exclusive ``flock``, one ``write`` each, so
xdist workers can share a file and a crash loses at most the row being written. A torn
last line is skipped on read.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import operator
import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import MISSING, dataclass, field, fields
from enum import StrEnum
from pathlib import Path
from typing import Any

from pytest_budgetbench.errors import ConfigError, RecordError

SCHEMA_VERSION = 3
"""The on-disk shape of a cells.jsonl row. Bump it when a field is added, removed, renamed
or changes meaning, and keep :meth:`CellRow.from_record` reading the older versions."""


class Status(StrEnum):
    """How a cell ended. A StrEnum, so a status equals its text (``Status.OK == "ok"``)
    and is written to cells.jsonl as that text."""

    OK = "ok"
    """Sent within budget and graded."""
    VIOLATION = "violation"
    """The post-strategy prompt counted more tokens than the budget; nothing was sent."""
    ERROR = "error"
    """The strategy, the model or the grader failed; also a cell that never finished."""


FINAL_STATUSES = frozenset({Status.OK, Status.VIOLATION})
"""A cell recorded with one of these is done: a resume keeps it; errors run again."""


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
    run_id: str
    cell_id: str
    task: str
    item_id: str
    category: str | None = None
    strategy: str
    regime: str | None = None
    reference: bool = False
    budget: int
    repeat: int = 0
    status: Status = Status.ERROR  # a cell that never finishes errored
    counted_tokens: int | None = None
    server_prompt_tokens: int | None = None
    token_count_match: bool | None = None
    utilisation: float | None = None
    quality: float | None = None
    prediction: str | None = None
    extracted: str | None = None
    gold: Any = None  # the item's gold answer(s), as the task holds them (schema 2)
    strategy_s: float | None = None
    model_s: float | None = None  # the original call's latency, also when served from cache
    cached: bool | None = None  # the reply came from the response cache (this cell sent nothing)
    output_tokens: int | None = None
    aux_calls: list[dict[str, Any]] = field(default_factory=list)
    aux_input_tokens: int = 0
    aux_output_tokens: int = 0
    aux_s: float = 0.0
    aux_failures: int = 0  # auxiliary replies the strategy could not use (not JSON, wrong keys)
    strategy_info: dict[str, Any] | None = None
    model: str | None = None
    endpoint: str | None = None
    server_flags: dict[str, Any] = field(default_factory=dict)
    tokenizer: str | None = None
    tokenizer_exact: bool | None = None
    prompt_sha256: str | None = None
    grader: str | None = None
    error: str | None = None
    seed: int | None = None
    worker: str | None = None  # the xdist worker that ran the cell, or null
    time: float | None = None
    # An agent episode's cell (schema 3); null for a single-call cell. counted_tokens is
    # then its largest call's count, model_s and output_tokens its calls' sums.
    calls: int | None = None  # model calls made, the one over budget included
    ended: str | None = None  # done | violation | max_calls | error
    call_tokens: list[int] | None = None  # counted prompt tokens per call
    max_call_tokens: int | None = None
    p95_call_tokens: int | None = None
    sum_call_tokens: int | None = None  # counted prompt tokens of the calls sent
    violated_call: int | None = None  # 1-based index of the call over budget
    total_tokens: int | None = None  # every sent call's prompt and output tokens: its cost
    prefix_reuse: float | None = None  # share of prompt tokens the previous call's prefix held

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
_FIELD_NAMES = frozenset(ROW_FIELDS)
_all_values = operator.attrgetter(*ROW_FIELDS)  # every field's value in one call
_REQUIRED: tuple[str, ...] = tuple(
    f.name for f in fields(CellRow) if f.default is MISSING and f.default_factory is MISSING
)

CELLS_FILE = "cells.jsonl"
PROMPTS_FILE = "prompts.jsonl"
EPISODES_FILE = "episodes.jsonl"  # an episode cell's trajectory and its calls, one record a cell
RUN_FILE = "run.json"
LOCK_FILE = "run.lock"
REPLICAS_FILE = "replicas.jsonl"  # replicas of the endpoint taken out and back (replicas.py)
STRATEGY_FILES = "strategy-files"  # the one place in a run where strategies may write


def append_jsonl(path: Path, row: Mapping[str, Any]) -> None:
    """Append one JSON line, whole or not at all, under an exclusive lock.

    The line is redacted (see :func:`_redacted_line`). A write that the disk cuts short
    (ENOSPC, a short ``os.write``) is undone, the file truncated back to its last line
    boundary, and raised as RecordError: the cell errors, it never passes unrecorded.
    """
    line = _redacted_line(row)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as exc:
        raise RecordError(f"cannot open {path} to record a row: {exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            _terminate_torn_line(fd, path)
            _write_whole(fd, path, line)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def _redacted_line(row: Mapping[str, Any]) -> bytes:
    """The row as one JSON line, with no secret in it: the ``error`` text (ours, and what
    servers echoed into it) fully redacted; everything else, which is data (prompts,
    predictions, whose URLs are content), only cleared of the secret values themselves."""
    from pytest_budgetbench.redact import redact, redact_known

    if isinstance(row.get("error"), str):
        row = {**row, "error": redact(row["error"])}
    text = redact_known(json.dumps(row, ensure_ascii=False, default=str))
    return (text + "\n").encode("utf-8")


def _write_whole(fd: int, path: Path, data: bytes) -> None:
    """Write all of ``data`` at the end of the file, or cut the file back and raise."""
    start = os.fstat(fd).st_size
    written = 0
    try:
        while written < len(data):
            count = os.write(fd, data[written:])
            if count <= 0:
                raise OSError(errno.ENOSPC, "the write made no progress")
            written += count
    except OSError as exc:
        _truncate(fd, start)
        raise RecordError(
            f"could not record a row in {path}: wrote {written} of {len(data)} bytes "
            f"({exc.strerror or exc}); the file was cut back to its last whole line. "
            "Free space (or pass --budgetbench-out=DIR on another disk) and resume with "
            "--budgetbench-resume=latest"
        ) from None


def _truncate(fd: int, size: int) -> None:
    with contextlib.suppress(OSError):  # nothing more to do: the reader skips a torn line
        os.ftruncate(fd, size)


def _terminate_torn_line(fd: int, path: Path) -> None:
    """If a crash left a partial last line, end it so the next row starts clean."""
    size = os.fstat(fd).st_size
    if size == 0:
        return
    with path.open("rb") as existing:
        existing.seek(size - 1)
        if existing.read(1) != b"\n":
            _write_whole(fd, path, b"\n")


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of a JSONL file; lines that are not whole JSON objects (a torn write) are skipped."""
    if not path.exists():
        return
    with path.open("rb") as handle:
        for raw in handle:
            try:
                row = json.loads(raw)
            except ValueError:
                continue
            if isinstance(row, dict):
                yield row


def last_row_per_cell(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per cell id: the last one, as a resumed run supersedes its errors."""
    return list({row.get("cell_id"): row for row in rows}.values())


class RunStore:
    """The files of one run directory."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._lock_fd: int | None = None

    def lock(self) -> None:
        """Hold the run for this session (the controller's; its xdist workers append under
        it), so that a second session on the same run, a ``--budgetbench-resume=latest``
        started meanwhile, is refused instead of recording a second row per cell. The lock
        (``flock``) goes with the process, so a killed session leaves none behind."""
        path = self.run_dir / LOCK_FILE
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise RecordError(f"cannot open {path} to hold the run: {exc}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise ConfigError(
                f"run {self.run_dir} is in use by another budgetbench session (pid {holder}); "
                "wait until it ends and resume then, or start a new run"
            ) from None
        with contextlib.suppress(OSError):  # the pid only names the holder (a full disk)
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._lock_fd, 0)
            os.close(self._lock_fd)
            self._lock_fd = None

    @property
    def cells_path(self) -> Path:
        return self.run_dir / CELLS_FILE

    @property
    def prompts_path(self) -> Path:
        return self.run_dir / PROMPTS_FILE

    def write_row(self, row: CellRow) -> None:
        append_jsonl(self.cells_path, row.record())

    def write_prompt(self, cell_id: str, sha256: str, messages: object | None) -> None:
        record: dict[str, Any] = {"cell_id": cell_id, "prompt_sha256": sha256}
        if messages is not None:
            record["messages"] = messages
        append_jsonl(self.prompts_path, record)

    def write_episode(self, record: Mapping[str, Any]) -> None:
        """An agent episode's trajectory and calls, before its row (see episode.py)."""
        append_jsonl(self.run_dir / EPISODES_FILE, record)

    def episodes(self) -> dict[str, dict[str, Any]]:
        """The recorded episodes by cell id, the last record of each."""
        return {str(record.get("cell_id")): record
                for record in read_jsonl(self.run_dir / EPISODES_FILE)}

    def write_export(self, file_name: str, record: Mapping[str, Any]) -> None:
        append_jsonl(self.run_dir / "exports" / file_name, record)

    def rows(self) -> list[dict[str, Any]]:
        return list(read_jsonl(self.cells_path))

    def write_run_info(self, info: Mapping[str, Any]) -> None:
        from pytest_budgetbench.redact import redact_obj

        text = json.dumps(redact_obj(info), indent=2, default=str) + "\n"
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            (self.run_dir / RUN_FILE).write_text(text)
        except OSError as exc:
            raise RecordError(f"cannot write {self.run_dir / RUN_FILE}: {exc}") from None
