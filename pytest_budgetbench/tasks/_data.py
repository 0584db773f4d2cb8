"""Reading official benchmark files, with one-line DataErrors that say how to fix them.

Every message names the task, the file (and the record, when one is at fault) and the
option that points at the right file, e.g.::

    task 'locomo' needs locomo10.json: pass --budgetbench-data-locomo=PATH
    (file not found: data/locomo10.json)
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pytest_budgetbench.errors import DataError, MalformedLine


def flag(task: str) -> str:
    return f"--budgetbench-data-{task}=PATH (or BUDGETBENCH_DATA_{task.upper()})"


def one_line(text: object, limit: int = 160) -> str:
    """An exception text on one short line, so the DataError stays one line."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def missing(task: str, wanted: str, problem: str) -> DataError:
    return DataError(f"task '{task}' needs {wanted}: pass {flag(task)} ({one_line(problem)})")


def malformed(task: str, path: Path, problem: str, wanted: str | None = None) -> DataError:
    hint = f"point {flag(task)} at the official {wanted or path.name}"
    return DataError(f"task '{task}' cannot read {path}: {one_line(problem)}; {hint}")


def resolve_file(task: str, path: Path | None, official: tuple[str, ...]) -> Path:
    """The data file: ``path`` itself, or the first official file name inside a directory."""
    wanted = " or ".join(official)
    if path is None:
        raise missing(task, wanted, "no path given")
    if path.is_dir():
        for name in official:
            if (path / name).is_file():
                return path / name
        raise missing(task, wanted, f"no {wanted} in directory {path}")
    if not path.is_file():
        raise missing(task, wanted, f"file not found: {path}")
    return path


def read_text(path: Path) -> str:
    """A data file's text, read as UTF-8 (a leading byte-order mark dropped).

    An OSError propagates, for the caller to word; a byte that is not UTF-8 raises
    :class:`~pytest_budgetbench.errors.MalformedLine` naming its line, its column and the
    byte, because the decoder's byte offset is no help to someone opening the file in an
    editor.
    """
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        # exc.object is what was decoded (after a BOM): exc.start counts in it.
        raise not_utf8(exc.object, exc.start) from None


def not_utf8(data: bytes, start: int) -> MalformedLine:
    """The error for the byte at offset ``start`` of ``data``, which is not UTF-8.

    Lines end at LF, as :func:`json_lines` splits them; the column is 1-based and
    counts characters, as editors show it (the bytes before ``start`` decode, since the
    decoder stops at the first bad one)."""
    line_start = data.rfind(b"\n", 0, start) + 1
    line = data.count(b"\n", 0, start) + 1
    column = len(data[line_start:start].decode("utf-8", errors="replace")) + 1
    return MalformedLine(line, f"byte 0x{data[start]:02x} at column {column} (counting "
                         "characters) is not UTF-8: save the file as UTF-8")


def read_data_text(task: str, path: Path, wanted: str | None = None) -> str:
    """A task's data file as text; one line naming the file when it cannot be read or is
    not UTF-8."""
    try:
        return read_text(path)
    except OSError as exc:
        raise malformed(task, path, f"cannot read it ({exc})", wanted) from exc
    except MalformedLine as exc:
        raise malformed(task, path, str(exc), wanted) from None


def read_json(task: str, path: Path, wanted: str | None = None) -> Any:
    """A JSON file, or a JSON-lines file when it ends in ``.jsonl``."""
    text = read_data_text(task, path, wanted)
    if path.suffix == ".jsonl":
        try:
            return [value for _number, value in json_lines(text)]
        except MalformedLine as exc:
            raise malformed(task, path, f"line {exc.line} is {exc.problem}", wanted) from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise malformed(task, path, f"invalid JSON ({exc})", wanted) from exc


def json_lines(text: str) -> Iterator[tuple[int, Any]]:
    """(line number, value) of each non-blank line of a JSON-lines text; a line that is
    not JSON raises :class:`~pytest_budgetbench.errors.MalformedLine`, for the caller to
    name its file.

    Lines end at LF only (a CR before it is JSON whitespace): U+2028, U+2029 and U+0085,
    which ``str.splitlines`` also breaks at, are characters of a JSON string."""
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip():
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as exc:
                raise MalformedLine(
                    number, f"not valid JSON ({exc.msg} at column {exc.colno})") from exc


def records(task: str, path: Path, data: Any, wanted: str | None = None) -> list[dict[str, Any]]:
    """``data`` as a non-empty list of JSON objects."""
    if not isinstance(data, list):
        raise malformed(task, path, f"expected a JSON list of records, got {type(data).__name__}",
                        wanted)
    if not data:
        raise malformed(task, path, "the file holds no records", wanted)
    for index, record in enumerate(data):
        if not isinstance(record, dict):
            raise malformed(task, path, f"record {index} is a {type(record).__name__}, "
                            "not an object", wanted)
    return data


def require(
    task: str,
    path: Path,
    record: Mapping[str, Any],
    index: int,
    fields: Iterable[str],
    key: str | None = None,
) -> None:
    """Raise a DataError naming the record when it lacks any of ``fields``."""
    absent = [name for name in fields if name not in record]
    if absent:
        label = f"record {index}"
        if key and key in record:
            label += f" ({key}={record[key]!r})"
        raise malformed(task, path, f"{label} lacks field(s) {', '.join(absent)}")


def cell_suffix(cell_id: str) -> str:
    """The strategy-budget part of a cell id (``task-item-strategy-budget[-rN]``).

    Export files are split by it, because upstream evaluators key predictions by item id
    and one item appears once per strategy and budget.
    """
    parts = cell_id.split("-")
    return "-".join(parts[2:]) if len(parts) >= 4 else "run"
