"""Reading run records into one DataFrame: shards concatenate, resumed cells keep their
last row, and columns get the types the tables expect."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_budgetbench.records import CELLS_FILE, ROW_FIELDS, RUN_FILE, read_jsonl

if TYPE_CHECKING:
    import pandas as pd

CELL_KEY: tuple[str, ...] = ("task", "item_id", "strategy", "budget", "repeat")
NUMERIC_FIELDS: tuple[str, ...] = (
    "counted_tokens",
    "utilisation",
    "quality",
    "strategy_s",
    "model_s",
    "output_tokens",
    "aux_input_tokens",
    "aux_output_tokens",
    "aux_s",
)
NO_CATEGORY = "(none)"


class ReportError(Exception):
    """The records cannot make a report (a missing run directory, for one)."""


def cells_path(run_dir: Path) -> Path:
    """The cells file of a run directory; a cells.jsonl path is accepted as itself."""
    return run_dir if run_dir.is_file() else run_dir / CELLS_FILE


def read_rows(run_dirs: Sequence[Path]) -> list[dict[str, Any]]:
    """Every row of every run, in the order given (later runs win on duplicate cells)."""
    rows: list[dict[str, Any]] = []
    for run_dir in run_dirs:
        if not run_dir.exists():
            raise ReportError(f"run directory not found: {run_dir}")
        rows.extend(_read_cells(cells_path(run_dir)))
    return rows


def _read_cells(path: Path) -> list[dict[str, Any]]:
    """All rows of a cells file, parsed as one JSON array when every line is whole.

    One parse of the joined lines is about twice as fast as a parse per line; any bad line
    (a torn write) falls back to read_jsonl, which skips it, so the result is the same.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    lines = [line for line in data.split(b"\n") if line.strip()]
    try:
        parsed = json.loads(b"[" + b",".join(lines) + b"]")
    except ValueError:
        return list(read_jsonl(path))
    if len(parsed) != len(lines):  # a line held several values: not one row per line
        return list(read_jsonl(path))
    return [row for row in parsed if isinstance(row, dict)]


def read_run_info(run_dirs: Iterable[Path]) -> list[dict[str, Any]]:
    """The run.json of each run that has one (settings, for the report's provenance)."""
    infos = []
    for run_dir in run_dirs:
        path = (run_dir.parent if run_dir.is_file() else run_dir) / RUN_FILE
        try:
            info = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(info, dict):
            infos.append(info)
    return infos


def _aux_call_count(value: object) -> float:
    # The runner records the calls themselves (a list); older or hand-made rows a count.
    if isinstance(value, list):
        return float(len(value))
    if isinstance(value, bool) or value is None:
        return float("nan")
    if isinstance(value, int | float):
        return float(value)
    return float("nan")


def frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """Rows as a typed DataFrame with one row per cell key (the last row of a cell wins)."""
    import pandas as pd

    df = pd.DataFrame.from_records(rows, columns=list(_columns(rows)))
    df = df.dropna(subset=["task", "item_id", "strategy", "budget"])
    df["task"] = df["task"].astype(str)
    df["item_id"] = df["item_id"].astype(str)
    df["strategy"] = df["strategy"].astype(str)
    df["budget"] = pd.to_numeric(df["budget"], errors="coerce")
    df = df.dropna(subset=["budget"])
    df["budget"] = df["budget"].astype("int64")
    df["repeat"] = pd.to_numeric(df["repeat"], errors="coerce").fillna(0).astype("int64")
    df["status"] = df["status"].fillna("error").astype(str)
    df["category"] = df["category"].map(_category).astype(str)
    df["reference"] = df["reference"].eq(True).astype(bool)
    for name in NUMERIC_FIELDS:
        df[name] = pd.to_numeric(df[name], errors="coerce").astype("float64")
    df["aux_calls"] = df["aux_calls"].map(_aux_call_count).astype("float64")
    # Only scored, admitted cells have a quality; a stray value on another row is ignored.
    df.loc[df["status"] != "ok", "quality"] = float("nan")
    df = df.drop_duplicates(subset=list(CELL_KEY), keep="last")
    return df.reset_index(drop=True)


def _columns(rows: list[dict[str, Any]]) -> dict[str, None]:
    # ROW_FIELDS first so an empty or partial file still yields every expected column.
    columns: dict[str, None] = dict.fromkeys(ROW_FIELDS)
    for row in rows[:1000]:
        columns.update(dict.fromkeys(row))
    return columns


def _category(value: object) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return NO_CATEGORY
    text = str(value)
    return text if text else NO_CATEGORY


def load(run_dirs: Sequence[Path]) -> pd.DataFrame:
    """The merged, de-duplicated rows of the given runs (shards, repeats, resumes)."""
    return frame(read_rows(run_dirs))
