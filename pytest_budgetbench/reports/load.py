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
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from functools import cache
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.errors import ReportError
from pytest_budgetbench.records.rows import (
    CATEGORICAL,
    CELL_KEY,
    FINAL_STATUSES,
    MEASURES,
    ROW_FIELDS,
    Status,
)
from pytest_budgetbench.records.store import CELLS_FILE, RunStore

if TYPE_CHECKING:
    import pandas as pd

NO_CATEGORY = "(none)"
REPORT_FIELDS: tuple[str, ...] = (
    *CELL_KEY, "status", "category", "reference", *MEASURES, "aux_calls",
    "run_id", "model", "tokenizer", "error",
)
"""The row fields the report's own tables, facts and error list read: the cell's key and
the measures as the schema (records.rows) marks them, and a few fields it names."""

BLOCK_BYTES = 8 << 20
"""cells.jsonl is read in blocks of about this many bytes of whole lines."""

_COLUMN_SAMPLE = 1000
"""Keys beyond the schema become columns when one of the first this many rows has them."""

# String fields with few distinct values (the schema's CATEGORICAL): each distinct value is
# kept once per block, so a million rows hold a million pointers to one "memory", not a
# million copies of it.


def cells_path(run_dir: Path) -> Path:
    """The cells file of a run directory; a cells.jsonl path is accepted as itself."""
    return run_dir if run_dir.is_file() else run_dir / CELLS_FILE


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
    return cells_path(run_dir)


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
    """The rows of a cells file, one block of whole lines at a time (none if it is absent)."""
    try:
        handle = path.open("rb")
    except FileNotFoundError:
        return
    except OSError as exc:  # a directory, a symlink loop, no permission
        raise ReportError(f"cannot read {path} ({exc.strerror or exc}): pass a run directory "
                          f"(<out>/<run_id>) or its {CELLS_FILE}") from None
    with handle:
        rest = b""
        while chunk := handle.read(block_bytes or BLOCK_BYTES):
            data = rest + chunk
            cut = data.rfind(b"\n") + 1
            rest = data[cut:]
            if cut:
                yield _parse(data[:cut])
        if rest:  # a last line without its newline: whole, or a torn write
            yield _parse(rest)


def _parse(data: bytes) -> list[dict[str, Any]]:
    """The rows of some whole lines; a line that is not a JSON object (a torn write) is
    skipped, as read_jsonl does.

    With orjson (the ``reports`` extra), each line is parsed by it, and any line it refuses
    by ``json`` (which also reads NaN, huge integers and lone surrogates): the rows are
    those ``json`` gives, three times as fast. Without it, one parse of the joined lines
    is about twice as fast as a parse per line, which it falls back to at a bad line.
    """
    lines = [line for line in data.split(b"\n") if line.strip()]
    fast = fast_loads()
    if fast is not None:
        return [row for row in (_load_line(fast, line) for line in lines)
                if isinstance(row, dict)]
    try:
        parsed = json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:
        return _parse_lines(lines)
    if len(parsed) != len(lines):  # a line held several values: not one row per line
        return _parse_lines(lines)
    return [row for row in parsed if isinstance(row, dict)]


def _parse_lines(lines: list[bytes]) -> list[dict[str, Any]]:
    return [row for row in (_load_line(None, line) for line in lines) if isinstance(row, dict)]


def _load_line(fast: Callable[[bytes], Any] | None, line: bytes) -> Any:
    if fast is not None:
        try:
            return fast(line)
        except ValueError:  # orjson.JSONDecodeError is one
            pass
    try:
        return json.loads(line)
    except ValueError:
        return None


def parse_line(line: bytes) -> dict[str, Any] | None:
    """One cells.jsonl line as a row, parsed as :func:`row_blocks` parses it; None for a
    line that is not a JSON object (a torn write)."""
    row = _load_line(fast_loads(), line)
    return row if isinstance(row, dict) else None


@cache
def fast_loads() -> Callable[[bytes], Any] | None:
    """orjson's parser where it is installed (looked up once, on first use), else None."""
    try:
        import orjson
    except ImportError:
        return None
    loads: Callable[[bytes], Any] = orjson.loads
    return loads


def read_run_info(run_dirs: Iterable[Path]) -> list[dict[str, Any]]:
    """The run.json of each run that has one (settings, for the report's provenance)."""
    return [info for info in map(run_info, run_dirs) if info is not None]


def run_info(run_dir: Path) -> dict[str, Any] | None:
    """A run's run.json (its settings and definition), or None when it has none or it
    cannot be read."""
    try:
        return RunStore.of(run_dir).run_info()
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
