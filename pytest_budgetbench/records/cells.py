"""cells.jsonl: one row per cell (:class:`~pytest_budgetbench.records.rows.CellRow`),
written and read here.

The runner appends a row as each cell ends (through :class:`~pytest_budgetbench.records.
store.RunStore`), ``regrade`` appends the rows it graded again, and the synthetic runs of
tests and benchmarks are written whole; the report streams the file in blocks, the
viewer, the summary, a resume and ``regrade`` read it row by row. Every reader skips a
line that is not a whole JSON object (a torn last line), with the one line parser of
:mod:`~pytest_budgetbench.records.jsonl`.

A row is read back as the JSON object written (a report reads a million of them, and
rows of older schema versions or with keys beyond it are kept as they are);
:meth:`CellRow.from_record <pytest_budgetbench.records.rows.CellRow.from_record>` makes
one typed.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pytest_budgetbench.records import jsonl

CELLS_FILE = "cells.jsonl"


def cells_file(path: Path) -> Path:
    """The cells file of a run directory; a file (a run's cells.jsonl) is taken as itself."""
    return path if path.is_file() else path / CELLS_FILE


def append_row(path: Path, row: Mapping[str, Any]) -> None:
    """Append one row (a CellRow's record, or a row read and graded again), whole or not
    at all, under the file's lock (see :func:`~pytest_budgetbench.records.jsonl.
    append_jsonl`)."""
    jsonl.append_jsonl(path, row)


def read_rows(path: Path) -> Iterator[dict[str, Any]]:
    """The rows of a cells file in its order (none when it does not exist); a torn line
    is skipped. Raises OSError where it cannot be read."""
    return jsonl.read_jsonl(path)


def row_blocks(path: Path, block_bytes: int = 0) -> Iterator[list[dict[str, Any]]]:
    """The rows of a cells file, one block of whole lines at a time (none when it does not
    exist), so that a reader of a million rows holds one block's dicts. Raises OSError
    where it cannot be read."""
    return jsonl.blocks(path, block_bytes)


def write_rows(run_dir: Path, rows: Iterable[Mapping[str, Any]], *, torn_tail: str = ""
               ) -> Path:
    """Write rows as a run directory's whole cells.jsonl (optionally ending in a torn
    line), for a run made up at once: the synthetic runs of tests and benchmarks."""
    path = run_dir / CELLS_FILE
    jsonl.write_lines(path, rows, torn_tail)
    return path
