"""Reading run records into one DataFrame: shards concatenate, resumed cells keep their
last row, and columns get the types the tables expect.

The files are streamed: a block of lines is parsed, turned into typed columns (numbers
as float64 and int64, strings shared between rows) and dropped before the next block is
read, so memory holds columns, not a dict per row. A report reads only the fields it
needs (:data:`REPORT_FIELDS` and its extensions' ``row_fields``).
"""

from __future__ import annotations

import ctypes
import gc
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.errors import ReportError
from pytest_budgetbench.records import cells, run_json
from pytest_budgetbench.records.cells import CELLS_FILE
from pytest_budgetbench.records.rows import (
    CATEGORICAL,
    CELL_KEY,
    FINAL_STATUSES,
    MEASURES,
    ROW_FIELDS,
    Status,
)
from pytest_budgetbench.records.run_json import RunInfo

if TYPE_CHECKING:
    import pandas as pd

NO_CATEGORY = "(none)"
REPORT_FIELDS: tuple[str, ...] = (
    *CELL_KEY, "status", "category", "reference", *MEASURES, "aux_calls",
    "run_id", "model", "tokenizer", "error",
)
"""The row fields the report's own tables, facts and error list read: the cell's key and
the measures as the schema (records.rows) marks them, and a few fields it names."""

_COLUMN_SAMPLE = 1000
"""Keys beyond the schema become columns when one of the first this many rows has them."""

# String fields with few distinct values (the schema's CATEGORICAL): each distinct value is
# kept once per block, so a million rows hold a million pointers to one "memory", not a
# million copies of it.


def load(run_dirs: Sequence[Path], fields: Iterable[str] | None = None, *,
         notes: list[str] | None = None) -> pd.DataFrame:
    """The merged, de-duplicated rows of the given runs (shards, repeats, resumes).

    ``fields`` keeps those row fields besides :data:`REPORT_FIELDS`, which are always
    kept; None keeps every field (the schema's, and any other key of the first 1,000 rows).
    ``notes`` gets a line for rows that another run's row of the same cell superseded,
    and for cells a run recorded twice as final (see :func:`superseded_notes`).
    """
    paths = [_cells_file(run_dir) for run_dir in run_dirs]
    with _collector_paused():
        if fields is None:
            columns = list(_columns(row for path in paths for block in row_blocks(path)
                                    for row in block))
        else:
            columns = report_columns(fields)
        blocks = []
        for index, path in enumerate(paths):
            for rows in row_blocks(path):
                if rows:
                    blocks.append(_typed(rows, columns))
                    if len(paths) > 1:  # which run each row is from, for the notes
                        blocks[-1][_SOURCE] = index
    merged = _merged(blocks or [_typed([], columns)], notes, [str(p) for p in run_dirs])
    del blocks
    _return_freed_memory()
    return merged


def _return_freed_memory() -> None:
    """Give the C heap's free pages back to the system (glibc only; elsewhere nothing).

    The blocks' rows and columns were small allocations, freed once merged; glibc keeps
    the holes they leave (about 200 MiB for a million rows), which the tables that follow
    cannot all reuse, so they would count twice in the report's peak memory.
    """
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError, TypeError):  # not glibc
        return
    trim(0)


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Parsing makes millions of dicts and no reference cycles: the cyclic collector, which
    would walk them over and over as they are made, waits until the rows are columns."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def frame(rows: list[dict[str, Any]], fields: Iterable[str] | None = None) -> pd.DataFrame:
    """Rows as a typed DataFrame with one row per cell key (the last row of a cell wins)."""
    columns = list(_columns(rows)) if fields is None else report_columns(fields)
    return _merged([_typed(rows, columns)])


def report_columns(fields: Iterable[str]) -> list[str]:
    """The frame's columns for these fields and the report's own, in schema order."""
    wanted = dict.fromkeys([*REPORT_FIELDS, *fields])
    return [*(name for name in ROW_FIELDS if name in wanted),
            *(name for name in wanted if name not in ROW_FIELDS)]


def _cells_file(run_dir: Path) -> Path:
    if not run_dir.exists():
        raise ReportError(f"run directory not found: {run_dir}")
    return cells.cells_file(run_dir)


def require_rows(run_dir: Path) -> None:
    """Raise ReportError, saying what is missing, unless the run holds a row that a report
    reads (a command over no rows would report, or pass a gate, on nothing)."""
    path = _cells_file(run_dir)
    objects = 0
    for block in row_blocks(path, _PROBE_BYTES):
        objects += len(block)
        if block and not _typed(block, report_columns(())).empty:
            return
    hint = f"pass a run directory (<out>/<run_id>) or its {CELLS_FILE}"
    if not path.exists():
        raise ReportError(f"{run_dir} has no {CELLS_FILE}: {hint}")
    if objects:
        raise ReportError(f"{path} holds {objects} JSON objects but no cell row (one with "
                          f"task, item_id, strategy and budget): {hint}")
    if path.stat().st_size:
        raise ReportError(f"{path} holds no JSON object on any line: {hint}")
    raise ReportError(f"{path} is empty: the run recorded no cell (did it run any?)")


_PROBE_BYTES = 1 << 16
"""require_rows reads blocks this small: a run's first rows are found in the first one."""


def row_blocks(path: Path, block_bytes: int = 0) -> Iterator[list[dict[str, Any]]]:
    """The rows of a cells file, one block of whole lines at a time (none if it is absent;
    :func:`~pytest_budgetbench.records.cells.row_blocks`), a file that cannot be read one
    ReportError."""
    try:
        yield from cells.row_blocks(path, block_bytes)
    except OSError as exc:  # a directory, a symlink loop, no permission
        raise ReportError(f"cannot read {path} ({exc.strerror or exc}): pass a run directory "
                          f"(<out>/<run_id>) or its {CELLS_FILE}") from None


def read_run_info(run_dirs: Iterable[Path]) -> list[RunInfo]:
    """The run.json of each run that has one (settings, for the report's provenance)."""
    return [info for info in map(run_info, run_dirs) if info is not None]


def run_info(run_dir: Path) -> RunInfo | None:
    """A run's run.json (its settings and definition), or None when it has none or it
    cannot be read."""
    try:
        return run_json.read_run(run_dir)
    except (OSError, ValueError):
        return None


def _aux_call_count(value: object) -> float:
    # The runner records the calls themselves (a list); older or hand-made rows a count.
    if isinstance(value, list):
        return float(len(value))
    if isinstance(value, bool) or value is None:
        return float("nan")
    if isinstance(value, int | float):
        return float(value)
    return float("nan")


def _typed(rows: list[dict[str, Any]], columns: list[str]) -> pd.DataFrame:
    """One block of rows as typed columns. Every step works row by row, so the blocks of
    a file concatenate into what the whole file would give."""
    import pandas as pd

    df = pd.DataFrame.from_records(rows, columns=columns)
    df = df.dropna(subset=["task", "item_id", "strategy", "budget"])
    df["task"] = df["task"].astype(str)
    df["item_id"] = df["item_id"].astype(str)
    df["strategy"] = df["strategy"].astype(str)
    df["budget"] = pd.to_numeric(df["budget"], errors="coerce")
    df = df.dropna(subset=["budget"])
    df["budget"] = df["budget"].astype("int64")
    df["repeat"] = pd.to_numeric(df["repeat"], errors="coerce").fillna(0).astype("int64")
    df["status"] = df["status"].fillna(Status.ERROR.value).astype(str)
    df["category"] = df["category"].map(_category).astype(str)
    df["reference"] = df["reference"].eq(True).astype(bool)
    for name in MEASURES:
        df[name] = pd.to_numeric(df[name], errors="coerce").astype("float64")
    df["aux_calls"] = df["aux_calls"].map(_aux_call_count).astype("float64")
    # Only scored, admitted cells have a quality; a stray value on another row is ignored.
    df.loc[df["status"] != Status.OK, "quality"] = float("nan")
    for name in CATEGORICAL.intersection(df.columns):
        df[name] = _shared(df[name])
    return df


def _shared(column: pd.Series) -> pd.Series:
    """The column with each distinct value held once (parsed JSON makes a copy per row)."""
    import numpy as np
    import pandas as pd

    try:
        codes, distinct = pd.factorize(column)
    except TypeError:  # an unhashable value (a hand-made row): keep the column as it is
        return column
    if not len(distinct):  # nothing but missing values
        return column
    values = np.asarray(distinct, dtype=object).take(codes)
    missing = codes < 0
    values[missing] = column.to_numpy(dtype=object)[missing]  # None stays None, NaN NaN
    return pd.Series(values, index=column.index, dtype=column.dtype, name=column.name)


def _merged(blocks: list[pd.DataFrame], notes: list[str] | None = None,
            runs: Sequence[str] = ()) -> pd.DataFrame:
    import pandas as pd

    if len(blocks) == 1:
        df = blocks[0]
    else:
        df = pd.concat(blocks, ignore_index=True)
        # A block with only None in a column infers it as object where the whole file
        # would infer str or float: infer again over all the blocks' values.
        for name, dtype in df.dtypes.items():
            if pd.api.types.is_object_dtype(dtype):
                df[name] = df[name].infer_objects()
    duplicate = df.duplicated(subset=list(CELL_KEY), keep="last")
    if duplicate.any():  # resumed cells: keep their last row (no copy when there are none)
        if notes is not None:
            notes.extend(superseded_notes(df, duplicate, runs))
        df = df.loc[~duplicate]
    if _SOURCE in df.columns:
        del df[_SOURCE]  # in place: a copy of every column would double the peak
    return df.reset_index(drop=True)


_SOURCE = "_budgetbench_run"
"""A column load() adds while it merges several runs: the index of each row's run."""


def superseded_notes(df: pd.DataFrame, duplicate: pd.Series, runs: Sequence[str]
                     ) -> list[str]:
    """Lines for the rows the merge drops that were not a resumed cell's earlier error:
    rows of a cell that a later run given holds too, and a run's second final row."""
    notes = []
    key = list(CELL_KEY)
    if _SOURCE in df.columns:
        kept = df.groupby(key, sort=False, observed=True)[_SOURCE].transform("last")
        across = duplicate & (df[_SOURCE] != kept)
    else:
        across = duplicate & False
    if across.any():
        first = df.loc[across].iloc[0]
        replaced_by = runs[int(kept[across].iloc[0])]
        cells = len(df.loc[across, key].drop_duplicates())
        notes.append(
            f"{int(across.sum())} rows superseded: {cells} cells are in more than one of the "
            f"runs given and the last run's row is kept for each (e.g. {first['task']} item "
            f"{first['item_id']} {first['strategy']}@{first['budget']} of "
            f"{runs[int(first[_SOURCE])]} by {replaced_by}'s); merging is for shards and "
            "resumes of one run: to compare runs use budgetbench diff RUN_A RUN_B")
    twice = duplicate & ~across & df["status"].isin(FINAL_STATUSES)
    if twice.any():
        first = df.loc[twice].iloc[0]
        where = runs[int(first[_SOURCE])] if _SOURCE in df.columns else (runs or ["the run"])[0]
        notes.append(
            f"{int(twice.sum())} final rows superseded: {where} recorded cells more than once "
            f"as ok or violation (e.g. {first['task']} item {first['item_id']} "
            f"{first['strategy']}@{first['budget']}; two sessions ran it at once?); the last "
            "row of each is kept")
    return notes


def _columns(rows: Iterable[dict[str, Any]]) -> dict[str, None]:
    # ROW_FIELDS first so an empty or partial file still yields every expected column.
    columns: dict[str, None] = dict.fromkeys(ROW_FIELDS)
    for row in islice(rows, _COLUMN_SAMPLE):
        columns.update(dict.fromkeys(row))
    return columns


def _category(value: object) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return NO_CATEGORY
    text = str(value)
    return text if text else NO_CATEGORY
